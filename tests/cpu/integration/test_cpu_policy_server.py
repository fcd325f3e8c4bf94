# SPDX-License-Identifier: Apache-2.0
"""The CPU policy server: vLLM 0.24's own OpenAI server over HTTP, playing `server_test_policy`
(`cpu_policy/episodes.py`). Its scripted completions' pure functions are tested in
`tests/cpu/unit/testing_support/test_cpu_policy_server_units.py`.

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

from recipe.nemo_gym.process_group import live_members
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy.episodes import SERVER_TEST_TOOL_CALL as TOOL_CALL_TEXT
from tests.support.cpu_policy.episodes import server_test_policy
from tests.support.cpu_policy.model_policy import CausalLMSampler, SamplingSpec
from tests.support.cpu_policy.qwen3 import ENDOFTEXT, IM_END, WEATHER_TOOL
from tests.support.cpu_policy.script import default_logprob
from tests.support.cpu_policy.server import CPUPolicyServer, CPUPolicyServerError
from tests.support.helpers import SharedStack

pytestmark = pytest.mark.integration

SERVED_NAME = "policy-under-test"
NEMO_GYM_LOGPROBS = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}
# With vLLM's qwen3 reasoning parser, output with no </think> is all reasoning unless thinking is off.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}

POLICY = server_test_policy()


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


def test_models_lists_the_served_name(server):
    with urllib.request.urlopen(f"{server.base_url}/models", timeout=30) as resp:
        models = json.loads(resp.read())
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]


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


def test_explicit_ids_with_length_end_and_max_tokens_cut(server):
    whole = chat(server, [{"role": "user", "content": "say ids"}])["choices"][0]
    assert generated_ids(whole) == [9707, 11, 1879]
    assert [e["logprob"] for e in whole["logprobs"]["content"]] == [-0.5, -0.25, -0.125]
    assert whole["finish_reason"] == "length"
    cut = chat(server, [{"role": "user", "content": "hello"}], max_tokens=3, **NO_THINKING)["choices"][0]
    assert len(generated_ids(cut)) == 3 and cut["finish_reason"] == "length" and cut["message"]["content"] == "Hel"


def test_tokenize_with_messages_equals_apply_chat_template(server, tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    body = {"model": SERVED_NAME, "messages": messages, "tools": [WEATHER_TOOL], "add_generation_prompt": True}
    tokens = post(f"{server.root_url}/tokenize", body)["tokens"]
    expected = tokenizer.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True)["input_ids"]
    assert tokens == expected


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


def test_stop_terminates_the_whole_process_group(own_server):
    server = own_server
    pgid = server.pgid
    assert pgid is not None and pgid in live_members(pgid, with_zombies=True)
    port = server.port
    server.stop()
    assert live_members(pgid, with_zombies=True) == []
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)


# -- start-up failures --------------------------------------------------------------------------------------------


def test_startup_with_a_bad_model_dir_fails_fast_with_the_child_output(tmp_path):
    started = time.monotonic()
    server = CPUPolicyServer(tmp_path / "no-such-model", splice_patch=False, startup_timeout_s=60)
    with pytest.raises(CPUPolicyServerError, match=r"(?s)exited with code 2.*no-such-model has no config\.json"):
        server.start()
    assert time.monotonic() - started < 60
    assert server.proc is None


def test_startup_past_the_deadline_is_killed_with_its_log_tail():
    server = CPUPolicyServer(tiny_qwen3_dir(), splice_patch=False, startup_timeout_s=3, grace_s=5)
    started = time.monotonic()
    with pytest.raises(CPUPolicyServerError, match=r"not healthy after 3 s; log tail:") as info:
        server.start()
    assert time.monotonic() - started < 3 + 2 * 5 + 30  # deadline, two grace periods, slack for a loaded box
    pgid = int(str(info.value).split("(pid ", 1)[1].split(")", 1)[0])
    assert live_members(pgid, with_zombies=True) == []
