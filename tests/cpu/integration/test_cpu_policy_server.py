# SPDX-License-Identifier: Apache-2.0
"""The CPU policy server: scripted completions (pure functions) and vLLM 0.24's own OpenAI server over HTTP.

One server process serves the whole module (start-up imports vLLM, about 30 s). It runs with
`--no-splice-patch` and vLLM's `qwen3` reasoning parser, a script for the scripted tests and the tiny model as
fallback for everything else. The test that stops it takes a server no other test uses after it (the shared one
when it runs last, as in file order) and checks /proc for survivors.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
import torch

from recipe.nemo_gym_testing.cpu_policy.model_policy import CausalLMSampler, SamplingSpec
from recipe.nemo_gym_testing.cpu_policy.qwen3 import ENDOFTEXT, IM_END, WEATHER_TOOL
from recipe.nemo_gym_testing.cpu_policy.script import (
    ScriptCompletion,
    ScriptedPolicy,
    ScriptMatch,
    ScriptRule,
    char_split,
    choose_rule,
    cut_at_stop_string,
    default_logprob,
    describe_no_match,
    scripted_output,
    view_prompt,
)
from recipe.nemo_gym_testing.cpu_policy.server import CPUPolicyServer, CPUPolicyServerError, group_members
from recipe.nemo_gym_testing.cpu_policy.tiny_model import tiny_qwen3_dir
from recipe.nemo_gym_testing.helpers import SharedStack

SERVED_NAME = "policy-under-test"
TOOL_CALL_TEXT = (
    "<think>\nI need the weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
NEMO_GYM_LOGPROBS = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}
# With vLLM's qwen3 reasoning parser, output with no </think> is all reasoning unless thinking is off.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}

POLICY = ScriptedPolicy(
    fallback="model",
    rules=[
        ScriptRule(
            name="greet-by-char",
            when=ScriptMatch(last_message_regex=r"^user\nhello"),
            completion=ScriptCompletion(text="Hello there!", split="char"),
        ),
        ScriptRule(
            name="weather-tool",
            when=ScriptMatch(last_message_regex=r"weather", assistant_turns=0),
            completion=ScriptCompletion(text=TOOL_CALL_TEXT),
        ),
        ScriptRule(
            name="after-tool",
            when=ScriptMatch(last_message_regex=r"<tool_response>", assistant_turns=1),
            completion=ScriptCompletion(text="It is sunny.", end="stop_token", stop_token_id=ENDOFTEXT),
        ),
        ScriptRule(
            name="explicit-ids",
            when=ScriptMatch(prompt_regex=r"say ids"),
            completion=ScriptCompletion(token_ids=[9707, 11, 1879], end="length", logprobs=[-0.5, -0.25, -0.125]),
        ),
    ],
)


# -- pure functions -------------------------------------------------------------------------------------------


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


# -- the server over HTTP ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers():
    """The module's policy servers, one live at a time: the test that stops one gets one of its own."""

    def start() -> CPUPolicyServer:
        return CPUPolicyServer(
            tiny_qwen3_dir(),
            script=POLICY,
            served_model_name=SERVED_NAME,
            splice_patch=False,
            extra_args=("--reasoning-parser", "qwen3"),
            startup_timeout_s=400,
        )

    with SharedStack(start) as holder:
        yield holder


@pytest.fixture
def server(servers):
    return servers.shared()


@pytest.fixture
def own_server(servers):
    return servers.own()


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())


def chat(server: CPUPolicyServer, messages: list[dict], **extra) -> dict:
    body = {"model": SERVED_NAME, "messages": messages, **NEMO_GYM_LOGPROBS, **extra}
    return post(f"{server.base_url}/chat/completions", body)


def generated_ids(choice: dict) -> list[int]:
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert all(t.startswith("token_id:") for t in tokens), tokens
    return [int(t.removeprefix("token_id:")) for t in tokens]


@pytest.mark.integration
def test_models_lists_the_served_name(server):
    with urllib.request.urlopen(f"{server.base_url}/models", timeout=30) as resp:
        models = json.loads(resp.read())
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]


@pytest.mark.integration
def test_char_split_completion_carries_one_token_per_character(server, tokenizer):
    choice = chat(server, [{"role": "user", "content": "hello"}], **NO_THINKING)["choices"][0]
    expected = [tokenizer.encode(c, add_special_tokens=False)[0] for c in "Hello there!"] + [IM_END]
    assert generated_ids(choice) == expected
    assert expected[:-1] != tokenizer.encode("Hello there!", add_special_tokens=False)  # re-tokenizing merges
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [
        default_logprob(t, i) for i, t in enumerate(expected)
    ]
    assert choice["message"]["content"] == "Hello there!"
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None


@pytest.mark.integration
def test_scripted_tool_call_is_parsed_into_tool_calls_and_reasoning(server, tokenizer):
    choice = chat(server, [{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER_TOOL])[
        "choices"
    ][0]
    calls = choice["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert choice["message"]["reasoning"].strip() == "I need the weather."
    assert choice["finish_reason"] == "tool_calls"
    assert generated_ids(choice) == tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False) + [IM_END]


@pytest.mark.integration
def test_second_turn_rule_ends_on_a_different_stop_token(server, tokenizer):
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    choice = chat(server, messages, tools=[WEATHER_TOOL], **NO_THINKING)["choices"][0]
    assert generated_ids(choice) == tokenizer.encode("It is sunny.", add_special_tokens=False) + [ENDOFTEXT]
    assert choice["message"]["content"] == "It is sunny."
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == ENDOFTEXT


@pytest.mark.integration
def test_explicit_ids_with_length_end_and_max_tokens_cut(server):
    whole = chat(server, [{"role": "user", "content": "say ids"}])["choices"][0]
    assert generated_ids(whole) == [9707, 11, 1879]
    assert [e["logprob"] for e in whole["logprobs"]["content"]] == [-0.5, -0.25, -0.125]
    assert whole["finish_reason"] == "length"
    cut = chat(server, [{"role": "user", "content": "hello"}], max_tokens=3, **NO_THINKING)["choices"][0]
    assert len(generated_ids(cut)) == 3 and cut["finish_reason"] == "length" and cut["message"]["content"] == "Hel"


@pytest.mark.integration
def test_tokenize_with_messages_equals_apply_chat_template(server, tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    body = {"model": SERVED_NAME, "messages": messages, "tools": [WEATHER_TOOL], "add_generation_prompt": True}
    tokens = post(f"{server.root_url}/tokenize", body)["tokens"]
    expected = tokenizer.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True)["input_ids"]
    assert tokens == expected


@pytest.mark.integration
def test_tiny_model_generates_through_http_as_the_sampler_does_locally(server, tokenizer):
    messages = [{"role": "user", "content": "Tell me something."}]
    first = chat(server, messages, max_tokens=8, temperature=0)["choices"][0]
    second = chat(server, messages, max_tokens=8, temperature=0)["choices"][0]
    ids = generated_ids(first)
    assert ids == generated_ids(second) and len(ids) == 8 and first["finish_reason"] == "length"

    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    torch.set_num_threads(1)
    local = CausalLMSampler(tiny_qwen3_dir()).generate(prompt, SamplingSpec(max_tokens=8, temperature=0.0))
    assert ids == local.token_ids
    for entry, tok in zip(first["logprobs"]["content"], local.tokens, strict=True):
        assert math.isclose(entry["logprob"], tok.logprob, abs_tol=1e-4)

    seeded = [chat(server, messages, max_tokens=6, temperature=1.0, seed=s)["choices"][0] for s in (3, 3)]
    assert generated_ids(seeded[0]) == generated_ids(seeded[1])


@pytest.mark.integration
def test_hundred_concurrent_requests_all_complete(server, tokenizer):
    async def run() -> list[dict]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def one(i: int) -> dict:
                body = {
                    "model": SERVED_NAME,
                    "messages": [{"role": "user", "content": f"hello {i}"}],
                    **NEMO_GYM_LOGPROBS,
                }
                async with session.post(f"{server.base_url}/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    return await resp.json()

            return await asyncio.gather(*(one(i) for i in range(100)))

    results = asyncio.run(run())
    expected = [tokenizer.encode(c, add_special_tokens=False)[0] for c in "Hello there!"] + [IM_END]
    assert all(generated_ids(r["choices"][0]) == expected for r in results)


@pytest.mark.integration
def test_stop_terminates_the_whole_process_group(own_server):
    server = own_server
    pgid = server.pgid
    assert pgid is not None and pgid in group_members(pgid)
    port = server.port
    server.stop()
    assert group_members(pgid) == []
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)


# -- start-up failures --------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_startup_with_a_bad_model_dir_fails_fast_with_the_child_output(tmp_path):
    started = time.monotonic()
    server = CPUPolicyServer(tmp_path / "no-such-model", splice_patch=False, startup_timeout_s=60)
    with pytest.raises(CPUPolicyServerError, match=r"(?s)exited with code 2.*no-such-model has no config\.json"):
        server.start()
    assert time.monotonic() - started < 60
    assert server.proc is None


@pytest.mark.integration
def test_startup_past_the_deadline_is_killed_with_its_log_tail():
    server = CPUPolicyServer(tiny_qwen3_dir(), splice_patch=False, startup_timeout_s=3, grace_s=5)
    started = time.monotonic()
    with pytest.raises(CPUPolicyServerError, match=r"not healthy after 3 s; log tail:") as info:
        server.start()
    assert time.monotonic() - started < 3 + 2 * 5 + 30  # deadline, two grace periods, slack for a loaded box
    pgid = int(str(info.value).split("(pid ", 1)[1].split(")", 1)[0])
    assert group_members(pgid) == []
