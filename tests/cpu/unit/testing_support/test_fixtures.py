# SPDX-License-Identifier: Apache-2.0
"""The test fixtures themselves: the genuine Qwen3 tokenizer and chat template (the `tokenizer` fixture of
conftest.py), and the tiny model's sampler."""

from __future__ import annotations

import math

import pytest
import torch

from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy.model_policy import CausalLMSampler, SamplingSpec
from tests.support.cpu_policy.qwen3 import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
    WEATHER_TOOL,
)


@pytest.fixture(scope="module")
def sampler():
    torch.set_num_threads(1)
    return CausalLMSampler(tiny_qwen3_dir())


def tool_turn_messages() -> list[dict]:
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny, 21 C"},
    ]


def test_tokenizer_has_qwen3_special_token_ids(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == IM_END
    assert tokenizer.pad_token_id == ENDOFTEXT
    ids = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<tool_call>", "</tool_call>", "<think>", "</think>"])
    assert ids == [IM_START, TOOL_CALL, TOOL_CALL_END, THINK, THINK_END]


def test_chat_template_renders_tools_tool_call_reasoning_and_tool_response(tokenizer):
    text = tokenizer.apply_chat_template(
        tool_turn_messages(), tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou are helpful.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    # The assistant turn after the last user query keeps its reasoning, then the hermes-style tool call.
    assert (
        "<|im_start|>assistant\n<think>\nI should call the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")

    ids = tokenizer.apply_chat_template(tool_turn_messages(), tools=[WEATHER_TOOL], add_generation_prompt=True)[
        "input_ids"
    ]
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert ids[-3:] == [IM_START, 77091, 198]  # "<|im_start|>", "assistant", "\n"
    # <tool_call> appears twice in the template's tool instructions in the system turn, once in the call.
    assert ids.count(IM_END) == 4 and ids.count(THINK) == 1 and ids.count(TOOL_CALL) == 3


def test_chat_template_drops_reasoning_of_turns_before_the_last_user_query(tokenizer):
    messages = [*tool_turn_messages(), {"role": "assistant", "content": "It is sunny."}]
    messages.append({"role": "user", "content": "Thanks!"})
    text = tokenizer.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True)
    assert "I should call the tool." not in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather"' in text


def test_chat_template_without_thinking_prefills_an_empty_think_block(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_greedy_generation_is_deterministic_and_logprobs_match_a_full_forward(sampler, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)["input_ids"]
    spec = SamplingSpec(max_tokens=6, temperature=0.0, eos_token_id=IM_END)
    first, second = sampler.generate(prompt, spec), sampler.generate(prompt, spec)
    assert first.token_ids == second.token_ids and len(first.token_ids) == 6
    assert first.finish_reason == "length" and first.stop_reason is None
    assert all(t.rank == 1 for t in first.tokens)

    # The KV-cached loop must report the same log-probs as one forward pass over prompt + generation.
    with torch.inference_mode():
        logits = sampler.model(input_ids=torch.tensor([prompt + first.token_ids])).logits[0]
    full = torch.log_softmax(logits.float(), dim=-1)
    for i, tok in enumerate(first.tokens):
        expected = float(full[len(prompt) - 1 + i, tok.token_id])
        assert math.isclose(tok.logprob, expected, abs_tol=1e-4)
        assert tok.token_id == int(torch.argmax(full[len(prompt) - 1 + i]))


def test_seeded_sampling_is_reproducible_and_seed_dependent(sampler):
    prompt = [IM_START, 872, 198, 6023, IM_END, 198, IM_START, 77091, 198]
    base = dict(max_tokens=8, temperature=1.0, eos_token_id=IM_END, num_top_logprobs=2)
    a = sampler.generate(prompt, SamplingSpec(seed=7, **base))
    b = sampler.generate(prompt, SamplingSpec(seed=7, **base))
    c = sampler.generate(prompt, SamplingSpec(seed=8, **base))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert all(math.isfinite(t.logprob) and t.logprob < 0 and len(t.top) == 2 for t in a.tokens)
    assert all(t.top[0][1] >= t.top[1][1] >= t.logprob or t.rank <= 2 for t in a.tokens)


def test_generation_stops_on_a_stop_token_and_reports_it(sampler):
    prompt = [IM_START, 872, 198, 6023, IM_END, 198, IM_START, 77091, 198]
    greedy = sampler.generate(prompt, SamplingSpec(max_tokens=3, temperature=0.0))
    first = greedy.token_ids[0]
    stopped = sampler.generate(prompt, SamplingSpec(max_tokens=3, temperature=0.0, stop_token_ids=frozenset({first})))
    assert stopped.token_ids == [first]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == first
    as_eos = sampler.generate(prompt, SamplingSpec(max_tokens=3, temperature=0.0, eos_token_id=first))
    assert as_eos.token_ids == [first] and as_eos.finish_reason == "stop" and as_eos.stop_reason is None
    # min_tokens bans stop IDs until enough tokens exist; ignore_eos disables the EOS stop.
    held = sampler.generate(prompt, SamplingSpec(max_tokens=3, temperature=0.0, eos_token_id=first, min_tokens=2))
    assert held.token_ids[0] != first and len(held.token_ids) >= 2
    ignored = sampler.generate(prompt, SamplingSpec(max_tokens=3, temperature=0.0, eos_token_id=first, ignore_eos=True))
    assert ignored.token_ids == greedy.token_ids and ignored.finish_reason == "length"
