# SPDX-License-Identifier: Apache-2.0
"""The scripted-turn logits processor forces exactly the script's tokens, per batch row, as vLLM moves rows around.

The processor is built as vLLM builds it (`vllm_config`, device, pin-memory flag) over the tiny model's tokenizer;
vLLM's own `BatchUpdate` records drive it, and `apply` runs on a logits tensor of the vocabulary's width.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy.script import ScriptCompletion, ScriptedPolicy, ScriptMatch, ScriptRule
from tests.support.engine import SCRIPT_ENV
from tests.support.engine.script_choice import SCRIPT_XARG, script_body, scripted_row
from tests.support.engine.scripted_logits import ScriptedLogitsProcessor

VOCAB = 151669
EOS = 151645


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen3_dir())


@pytest.fixture
def processor(tmp_path, monkeypatch):
    policy = ScriptedPolicy(
        rules=[ScriptRule(name="hi", when=ScriptMatch(prompt_regex="say hi"), completion=ScriptCompletion(text="Hi!"))]
    )
    monkeypatch.setenv(SCRIPT_ENV, str(policy.to_file(tmp_path / "script.json")))
    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=str(tiny_qwen3_dir())))
    return ScriptedLogitsProcessor(config, torch.device("cpu"), False)


def _update(added=(), removed=(), moved=(), size=2) -> BatchUpdate:
    return BatchUpdate(batch_size=size, removed=list(removed), added=list(added), moved=list(moved))


def _forced(processor, rows: int) -> list[int | None]:
    """Per row: the one token left finite by `apply`, or None when the row is left alone."""
    logits = processor.apply(torch.zeros(rows, VOCAB))
    return [int(row.argmax()) if torch.isinf(row).sum() == VOCAB - 1 else None for row in logits]


def test_a_matching_request_is_forced_token_by_token_then_left_alone(processor, tokenizer):
    scripted = tokenizer.encode("Hi!", add_special_tokens=False) + [EOS]
    output: list[int] = []
    processor.update_state(_update(added=[(0, SamplingParams(), tokenizer.encode("please say hi"), output)], size=1))
    seen = []
    for _ in range(len(scripted) + 1):
        (token,) = _forced(processor, 1)
        seen.append(token)
        if token is not None:
            output.append(token)  # vLLM appends the sampled token to the live list
    assert seen == [*scripted, None]


def test_a_request_no_rule_matches_is_sampled_by_the_model(processor, tokenizer):
    processor.update_state(_update(added=[(0, SamplingParams(), tokenizer.encode("say bye"), [])], size=1))
    assert _forced(processor, 1) == [None]


def test_rows_follow_their_requests_when_vllm_swaps_moves_and_removes_them(processor, tokenizer):
    first = tokenizer.encode("Hi!", add_special_tokens=False)[0]
    processor.update_state(
        _update(added=[(0, SamplingParams(), tokenizer.encode("say hi"), []), (1, SamplingParams(), [1, 2], [])])
    )
    assert _forced(processor, 2) == [first, None]
    processor.update_state(_update(moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert _forced(processor, 2) == [None, first]
    processor.update_state(_update(moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)], size=1))
    assert _forced(processor, 1) == [first]
    processor.update_state(_update(removed=[0], size=0))
    assert _forced(processor, 1) == [None]


def _policy(name: str, pattern: str, text: str) -> ScriptedPolicy:
    return ScriptedPolicy(
        rules=[ScriptRule(name=name, when=ScriptMatch(prompt_regex=pattern), completion=ScriptCompletion(text=text))]
    )


def test_a_request_plays_the_script_its_extra_args_name_over_the_engine_wide_one(processor, tokenizer, tmp_path):
    own = _policy("bye", "say", "Bye!").to_file(tmp_path / "own.json")
    named = SamplingParams(extra_args={SCRIPT_XARG: str(own)})
    processor.update_state(
        _update(
            added=[(0, named, tokenizer.encode("say hi"), []), (1, SamplingParams(), tokenizer.encode("say hi"), [])]
        )
    )
    bye, hi = (tokenizer.encode(text, add_special_tokens=False)[0] for text in ("Bye!", "Hi!"))
    assert _forced(processor, 2) == [bye, hi]


def test_without_an_engine_wide_script_only_requests_that_name_one_are_scripted(tokenizer, tmp_path, monkeypatch):
    monkeypatch.delenv(SCRIPT_ENV, raising=False)
    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=str(tiny_qwen3_dir())))
    processor = ScriptedLogitsProcessor(config, torch.device("cpu"), False)
    script = tmp_path / "script.json"
    _policy("a", "say", "Alpha").to_file(script)
    named = SamplingParams(extra_args={SCRIPT_XARG: str(script)})
    prompt = tokenizer.encode("say hi")
    processor.update_state(_update(added=[(0, named, prompt, []), (1, SamplingParams(), prompt, [])]))
    alpha = tokenizer.encode("Alpha", add_special_tokens=False)[0]
    assert _forced(processor, 2) == [alpha, None]
    # A new version of the same file is read again (modules reuse a path with a new script).
    _policy("b", "say", "Beta, longer").to_file(script)
    os.utime(script, ns=(time.time_ns() + 10**9,) * 2)
    processor.update_state(_update(added=[(1, named, prompt, [])], removed=[1]))
    beta = tokenizer.encode("Beta, longer", add_special_tokens=False)[0]
    assert _forced(processor, 2) == [alpha, beta]


def test_scripted_row_names_the_script_in_every_model_call_and_keeps_the_rows_extra_body(tmp_path):
    row = {
        "responses_create_params": {"input": [], "metadata": {"extra_body": json.dumps({"top_k": 5}), "k": "v"}},
        "agent_ref": {"name": "a"},
    }
    out = scripted_row(row, tmp_path / "s.json")
    assert json.loads(out["responses_create_params"]["metadata"]["extra_body"]) == {
        "top_k": 5,
        "vllm_xargs": {SCRIPT_XARG: str(tmp_path / "s.json")},
    }
    assert out["responses_create_params"]["metadata"]["k"] == "v"
    assert row["responses_create_params"]["metadata"]["extra_body"] == json.dumps({"top_k": 5})  # not modified
    assert script_body(tmp_path / "s.json") == {"vllm_xargs": {SCRIPT_XARG: str(tmp_path / "s.json")}}
