# SPDX-License-Identifier: Apache-2.0
"""The CPU policy server's scripted completions, as pure functions (`cpu_policy/script.py`): the prompt's view, the
rule chosen, the tokens and log-probs of a scripted output, a script's JSON and the message when no rule matches.
The server itself, over HTTP: `tests/cpu/integration/test_cpu_policy_server.py`."""

from __future__ import annotations

import math

import pytest

from tests.support.cpu_policy.episodes import server_test_policy
from tests.support.cpu_policy.script import (
    ScriptCompletion,
    ScriptedPolicy,
    ScriptRule,
    char_split,
    choose_rule,
    cut_at_stop_string,
    default_logprob,
    describe_no_match,
    scripted_output,
    view_prompt,
)

POLICY = server_test_policy()


def test_view_prompt_finds_last_complete_message_and_counts_assistant_turns():
    text = (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    view = view_prompt(text, "<|im_start|>", "<|im_end|>", "assistant")
    assert view.last_message == "user\n<tool_response>\nx\n</tool_response>"
    assert view.assistant_turns == 1


def test_choose_rule_takes_the_first_rule_whose_conditions_all_hold():
    prompt = "<|im_start|>user\nhello weather<|im_end|>\n<|im_start|>assistant\n"
    assert choose_rule(POLICY, prompt).name == "greet-by-char"
    assert choose_rule(POLICY, prompt.replace("hello ", "")).name == "weather-tool"
    assert choose_rule(POLICY, "<|im_start|>user\nnothing<|im_end|>\n<|im_start|>assistant\n") is None


def test_char_split_keeps_added_tokens_whole():
    vocab = {"<tool_call>": 100, "</tool_call>": 101}
    ids = char_split("a<tool_call>b</tool_call>", lambda s: [ord(s)], vocab)
    assert ids == [97, 100, 98, 101]


def test_scripted_output_ends_and_max_tokens_cut():
    def encode(text):
        return [ord(c) for c in text]

    eos = scripted_output(ScriptCompletion(text="abc"), encode=encode, added_vocab={}, eos_token_id=9, max_tokens=10)
    assert eos.token_ids == [97, 98, 99, 9] and eos.finish_reason == "stop" and eos.stop_reason is None
    assert eos.logprobs == [default_logprob(t, i) for i, t in enumerate([97, 98, 99, 9])]
    assert eos.logprobs[0] == -(1 + 97 % 50) / 100

    stop = scripted_output(
        ScriptCompletion(text="ab", end="stop_token", stop_token_id=7),
        encode=encode,
        added_vocab={},
        eos_token_id=9,
        max_tokens=10,
    )
    assert stop.token_ids == [97, 98, 7] and stop.finish_reason == "stop" and stop.stop_reason == 7

    length = scripted_output(
        ScriptCompletion(text="ab", end="length"), encode=encode, added_vocab={}, eos_token_id=9, max_tokens=10
    )
    assert length.token_ids == [97, 98] and length.finish_reason == "length"

    cut = scripted_output(ScriptCompletion(text="abc"), encode=encode, added_vocab={}, eos_token_id=9, max_tokens=2)
    assert cut.token_ids == [97, 98] and cut.finish_reason == "length" and cut.stop_reason is None


def test_scripted_output_rejects_logprob_count_mismatch():
    with pytest.raises(ValueError, match="3 tokens .* 2 log-probs"):
        scripted_output(
            ScriptCompletion(token_ids=[1, 2], logprobs=[-1.0, -1.0]),
            encode=lambda s: [],
            added_vocab={},
            eos_token_id=9,
            max_tokens=10,
        )


def test_policy_round_trips_through_json_including_non_finite_logprobs(tmp_path):
    policy = ScriptedPolicy(
        rules=[ScriptRule(completion=ScriptCompletion(token_ids=[5], logprobs=[float("nan"), 0.0]))]
    )
    loaded = ScriptedPolicy.from_file(policy.to_file(tmp_path / "p.json"))
    assert math.isnan(loaded.rules[0].completion.logprobs[0]) and loaded.rules[0].completion.token_ids == [5]
    (tmp_path / "bad.json").write_text('{"rules": [{"completion": {"text": "a", "token_ids": [1]}}]}')
    with pytest.raises(ValueError, match=r"(?s)bad\.json.*rules\.0\.completion.*exactly one of `text` and `token_ids`"):
        ScriptedPolicy.from_file(tmp_path / "bad.json")


def test_cut_at_stop_string_keeps_the_completing_token():
    def decode(ids):
        return "".join(chr(i) for i in ids)

    ids = [ord(c) for c in "abXYcd"]
    assert cut_at_stop_string(ids, ["XY", "c"], False, decode) == (4, "ab", "XY")
    assert cut_at_stop_string(ids, ["XY"], True, decode) == (4, "abXY", "XY")
    assert cut_at_stop_string(ids, ["zz"], False, decode) is None


def test_no_match_message_names_request_rules_and_prompt_tail():
    end = "<|im_start|>user\nodd<|im_end|>"
    message = describe_no_match(POLICY, "chatcmpl-42", "x" * 400 + end)
    assert "request chatcmpl-42" in message
    assert "(rules: greet-by-char, weather-tool, after-tool, explicit-ids)" in message
    # The last 300 characters of the prompt, repr-quoted.
    assert message.endswith("prompt tail: '..." + "x" * (300 - len(end)) + "<|im_start|>user\\nodd<|im_end|>'")
