# SPDX-License-Identifier: Apache-2.0
"""A 4-turn episode over HTTP: NeMo Gym's real training model server against verl's real vLLM server.

verl's own vLLM rollout runs standalone on vLLM's CPU build (`tests/support/engine/standalone.py`): a
`vLLMHttpServer` Ray actor serving vLLM's OpenAI app, with the splice patch armed in it by
`VERL_USE_EXTERNAL_MODULES` (as on a GPU node), the qwen3 reasoning parser and the hermes tool parser, and a scripted
policy forced inside the engine (`tests/support/engine/scripted_logits.py`). NeMo Gym's
`responses_api_models/vllm_model` app is built in this process from its shipped training config
(`vllm_model_for_training.yaml`: `return_token_id_information: true`, `uses_reasoning_parser: true`) and driven through
`/v1/responses` the way an agent drives it: each turn's output items go back as input.

Last, on the same server, the plugin's manager over NeMo Gym's math servers: the server dies (its actor killed)
while a batch's requests wait on it, held by vLLM's `/pause`, and the batch is aborted naming it. The module owns
this server, so killing it costs no other module an engine.
"""

import asyncio
import contextlib
import importlib.util
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.qwen3 import ENDOFTEXT, WEATHER_TOOL
from tests.support.cpu_policy.qwen3 import IM_END as EOS
from tests.support.cpu_policy.script import (
    ScriptCompletion,
    ScriptedPolicy,
    ScriptMatch,
    ScriptRule,
    char_split,
)
from tests.support.engine.standalone import init_local_ray, standalone_overrides, verl_rollout
from tests.support.helpers import SharedStack, free_port, math_row

pytestmark = pytest.mark.integration

SERVED_NAME = "policy"
# The Responses API (NeMo Gym's side) spells a function tool flat, not nested under "function".
TOOLS = [{"type": "function", **WEATHER_TOOL["function"], "strict": True}]
CUT_TEXT = "<think>\nShort.\n</think>\n\nAnything else? I could also che"


def _rule(turn: int, text: str, end: str = "eos") -> ScriptRule:
    # One token per character: re-tokenizing the returned text never reproduces these IDs.
    completion = ScriptCompletion(
        text=text, split="char", end=end, stop_token_id=ENDOFTEXT if end == "stop_token" else None
    )
    return ScriptRule(name=f"turn{turn}", when=ScriptMatch(assistant_turns=turn), completion=completion)


POLICY = ScriptedPolicy(
    rules=[
        _rule(0, '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'),
        _rule(1, "<think>\nThe tool said 18C.\n</think>\n\nIt is 18C in Paris."),
        _rule(2, CUT_TEXT, end="length"),  # the request's max_output_tokens cuts it right after the text
        _rule(3, "<think>\nDone.\n</think>\n\nBye!", end="stop_token"),
        _rule(4, "Bye."),  # the chat-path check after the episode
    ]
)


@pytest.fixture(scope="module")
def policy_servers(tmp_path_factory):
    """verl's vLLM server (one standalone replica) playing POLICY, started once for the module; the test that kills
    it takes it last (`own()`). VLLM_SERVER_DEV_MODE: vLLM's own /pause endpoint, to hold requests on a live server
    (its error-stack logging stays off: a test reads the server's log for tracebacks)."""
    import ray

    @contextlib.contextmanager
    def start():
        script = POLICY.to_file(tmp_path_factory.mktemp("policy") / "script.json")
        overrides = [
            *harness.cpu_trainer_overrides(
                tiny_qwen3_dir(), "/unused.yaml", prompt_length=2048, response_length=512, n=1, batch_size=1
            ),
            *standalone_overrides(scripted=True),
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.reasoning_parser=qwen3",
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm.served_model_name={SERVED_NAME}",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.log_error_stack=false",
        ]
        config = harness.compose_verl_config(overrides)
        init_local_ray()
        try:
            with verl_rollout(config, script_file=script, env={"VLLM_SERVER_DEV_MODE": "1"}) as rollout:
                yield rollout
        finally:
            ray.shutdown()

    with SharedStack(start) as holder:
        yield holder


@pytest.fixture
def policy_server(policy_servers):
    """The module's server; no test kills it."""
    return policy_servers.shared()


@pytest.fixture
def episode(policy_servers, policy_server):
    """The 4-turn episode, run once per started server."""
    from nemo_gym.server_utils import global_aiohttp_client_exit

    if "episode" not in policy_servers.cache:
        # NeMo Gym's HTTP client is one process-wide aiohttp session bound to the loop that made it: start from
        # none, make it on this episode's loop, and close it after.
        global_aiohttp_client_exit()
        try:
            policy_servers.cache["episode"] = asyncio.run(_episode(policy_server.base_urls[0]))
        finally:
            global_aiohttp_client_exit()
    return policy_servers.cache["episode"]


def _training_model_server(base_url: str):
    """NeMo Gym's vllm_model server object, configured from the YAML it ships for training."""
    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.server_utils import ServerClient
    from omegaconf import OmegaConf
    from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

    app_dir = Path(importlib.util.find_spec("responses_api_models.vllm_model.app").origin).parent
    shipped = OmegaConf.load(app_dir / "configs" / "vllm_model_for_training.yaml")
    values = OmegaConf.create(
        {"policy_base_url": base_url, "policy_api_key": "unused", "policy_model_name": SERVED_NAME}
    )
    merged = OmegaConf.merge(values, shipped)
    server_dict = OmegaConf.to_container(merged.policy_model.responses_api_models.vllm_model, resolve=True)
    config = VLLMModelConfig.model_validate({**server_dict, "host": "127.0.0.1", "port": 0, "name": "policy_model"})
    assert config.return_token_id_information and config.uses_reasoning_parser
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=9), global_config_dict=OmegaConf.create({})
    )
    return VLLMModel(config=config, server_client=client)


async def _episode(base_url: str) -> tuple[list[dict], dict]:
    """Run 4 turns; return per-turn token info, and the edited-history and chat-vs-tokenize results."""
    import httpx
    from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
    from nemo_gym.server_utils import GlobalAIOHTTPAsyncClientConfig, set_global_aiohttp_client

    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    model = _training_model_server(base_url)
    app = model.setup_webserver()
    model.setup_exception_middleware(app)  # as NeMo Gym's run_webserver does: inner-server errors become 500s
    turns: list[dict] = []
    items: list[dict] = [{"role": "user", "content": "What is the weather in Paris?", "type": "message"}]
    follow_ups = [None, "ok", "Rome too?", None]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://gym", timeout=120
    ) as client:
        for turn in range(4):
            body = {"input": items, "tools": TOOLS, "model": SERVED_NAME}
            if turn == 2:
                body["max_output_tokens"] = _cut_length()
            response = await client.post("/v1/responses", json=body)
            assert response.status_code == 200, response.text
            output = response.json()["output"]
            carrier = output[-1]
            turns.append(
                {
                    "prompt": [int(t) for t in carrier["prompt_token_ids"]],
                    "generation": [int(t) for t in carrier["generation_token_ids"]],
                    "types": [o["type"] for o in output],
                }
            )
            items = items + output
            calls = [o for o in output if o["type"] == "function_call"]
            for call in calls:
                items.append({"type": "function_call_output", "call_id": call["call_id"], "output": "18C, sunny"})
            if follow_ups[turn] is not None:
                items.append({"role": "user", "content": follow_ups[turn], "type": "message"})

        # An agent that drops the first exchange to save room: the server must refuse, not guess.
        edited = [items[0], *items[3:]]
        refused = await client.post("/v1/responses", json={"input": edited, "tools": TOOLS, "model": SERVED_NAME})
        refusal = {"status": refused.status_code, "text": refused.text}

        # The same final history through vLLM's chat path and /tokenize, as NeMo Gym sends them.
        body = NeMoGymResponseCreateParamsNonStreaming.model_validate(
            {"input": items, "tools": TOOLS, "model": SERVED_NAME}
        )
        chat_params = model._converter.responses_to_chat_completion_create_params(body).model_dump(exclude_unset=True)
    async with httpx.AsyncClient(base_url=base_url.removesuffix("/v1"), timeout=120) as raw:
        chat = await raw.post(
            "/v1/chat/completions",
            json={
                "model": SERVED_NAME,
                "messages": chat_params["messages"],
                "tools": chat_params["tools"],
                "return_token_ids": True,
            },
        )
        tokenized = await raw.post(
            "/tokenize", json={"model": SERVED_NAME, "messages": chat_params["messages"], "tools": chat_params["tools"]}
        )
    same_path = {"chat": chat.json().get("prompt_token_ids"), "tokenize": tokenized.json().get("tokens")}
    return turns, {**refusal, **same_path}


def _cut_length() -> int:
    """How many tokens the scripted cut turn has (its text one token per character, no terminator)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir()))
    return len(char_split(CUT_TEXT, lambda t: tok.encode(t, add_special_tokens=False), tok.get_added_vocab()))


def test_four_turn_episode_each_prompt_begins_with_previous_prompt_and_generation(episode):
    turns, _ = episode
    assert [t["types"][-1] for t in turns] == ["function_call", "message", "message", "message"]
    assert turns[0]["generation"][-1] == EOS
    assert turns[2]["generation"][-1] not in (EOS, ENDOFTEXT)  # cut at the length limit
    assert turns[3]["generation"][-1] == ENDOFTEXT  # ended on another stop token
    for previous, current in zip(turns, turns[1:], strict=False):
        true_prefix = previous["prompt"] + previous["generation"]
        assert current["prompt"][: len(true_prefix)] == true_prefix
        assert len(current["prompt"]) > len(true_prefix)


def test_edited_history_over_http_is_refused_with_the_rule_not_read_as_a_length_finish(episode):
    _, result = episode
    assert result["status"] == 500  # NeMo Gym relays vLLM's 400 as an inner-server failure
    assert "rule 2 (unedited history) failed" in result["text"]


def test_tokenize_and_chat_completions_see_the_same_spliced_prompt_over_http(episode):
    turns, result = episode
    assert result["chat"] is not None and result["chat"] == result["tokenize"]
    last = turns[-1]
    assert result["tokenize"][: len(last["prompt"]) + len(last["generation"])] == last["prompt"] + last["generation"]


async def _shared_pool_burst(root_url: str, valid: dict, refused: list[dict], n_valid: int) -> tuple[list, list]:
    import httpx

    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    async with httpx.AsyncClient(base_url=root_url, timeout=300, limits=limits) as client:
        bodies = [valid] * n_valid + refused * (n_valid // 4)
        order = sorted(range(len(bodies)), key=lambda i: (i * 7919) % len(bodies))  # interleave both kinds
        results = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=bodies[i]) for i in order), return_exceptions=True
        )
    by_index = dict(zip(order, results, strict=True))
    return [by_index[i] for i in range(n_valid)], [by_index[i] for i in range(n_valid, len(bodies))]


def test_refusals_keep_the_connection_and_valid_requests_sharing_the_pool_stay_exact(policy_server):
    """Spliced requests and refused ones (an edited history, vLLM's own non-JSON tool arguments) over one
    keep-alive pool: no transport error, every refusal a 400, every valid prompt exact, no traceback logged."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir()))
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    prompt = enc("<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\n")
    generation = [t for ch in "Hello there." for t in enc(ch)] + [EOS]
    carrier = {"role": "assistant", "content": "Hello there.", "prompt_token_ids": prompt}
    carrier |= {"generation_token_ids": generation, "generation_log_probs": [-0.5] * len(generation)}
    history = [{"role": "user", "content": "Hi."}, carrier, {"role": "user", "content": "Bye."}]
    expected = prompt + generation + enc("\n<|im_start|>user\nBye.<|im_end|>\n<|im_start|>assistant\n")
    valid = {"model": SERVED_NAME, "messages": history, "return_token_ids": True, "max_tokens": 64}
    truncated = {**valid, "messages": history[1:]}
    bad_call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}
    non_json = {
        "model": SERVED_NAME,
        "messages": [
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [bad_call]},
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        ],
    }
    log_path = policy_server.server_log()
    log_start = log_path.stat().st_size
    root_url = policy_server.base_urls[0].removesuffix("/v1")
    ok, refused = asyncio.run(_shared_pool_burst(root_url, valid, [truncated, non_json], 64))
    errors = [r for r in ok + refused if isinstance(r, BaseException)]
    assert errors == []
    assert [r.status_code for r in ok] == [200] * len(ok)
    assert all(r.json()["prompt_token_ids"] == expected for r in ok)
    assert [r.status_code for r in refused] == [400] * len(refused)
    assert all("token-exact splice refused: rule 2" in r.text for r in refused[0::2])
    log = log_path.read_bytes()[log_start:].decode("utf-8", errors="replace")
    assert "Traceback" not in log


def test_dead_policy_server_mid_batch_aborts_naming_it_well_within_the_deadline(policy_servers, tmp_path):
    """Kills verl's vLLM server actor while the manager's batch waits on it: the requests are held on the live,
    paused server (vLLM's /pause), then the actor is killed as when its node dies."""
    import ray

    from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
    from recipe.nemo_gym.failures import RolloutAborted

    rollout = policy_servers.own()
    plugin = tmp_path / "plugin.yaml"
    plugin.write_text(
        f"""
nemo_gym:
  config_paths:
    - responses_api_models/vllm_model/configs/vllm_model_for_training.yaml
    - resources_servers/math_with_judge/configs/math_with_judge.yaml
  uses_reasoning_parser: true
  head_server: {{port: {free_port()}}}
timeouts: {{startup_s: 600, batch_s: 300, health_check_interval_s: 1}}
"""
    )
    data = write_jsonl([math_row("What is 2+2?"), math_row("What is 3+1?")], tmp_path / "rows.jsonl")
    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), plugin, prompt_length=2048, response_length=512, n=1, batch_size=2
    )
    config = harness.compose_verl_config(overrides)
    dataset = NeMoGymJSONLDataset(data_files=[str(data)], tokenizer=None, processor=None, config=config.data)
    url = rollout.base_urls[0]
    with harness.manager_over(config, rollout.llm_client) as manager:
        request = urllib.request.Request(f"http://{rollout.addresses[0]}/pause?mode=keep", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["value"] = manager.generate_sequences(harness.trainer_batches(dataset, [0, 1], config)[1])
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                outcome["error"] = e
            outcome["ended"] = time.monotonic()

        t0 = time.monotonic()
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(6.0)  # six health checks: the paused server answers /health, so nothing aborts
        assert worker.is_alive(), f"the batch ended while the policy server was alive: {outcome}"
        killed = time.monotonic()
        ray.kill(rollout.servers[0])  # SIGKILL of the actor's process, as when its node dies
        worker.join(60.0)
        assert not worker.is_alive(), "the batch did not end after the policy server died"
    to_error = outcome["ended"] - killed
    print(
        f"\npolicy server killed {killed - t0:.1f}s into the batch (requests held on it); "
        f"RolloutAborted {to_error:.2f}s later (batch deadline 300s)"
    )
    error = outcome.get("error")
    assert isinstance(error, RolloutAborted), outcome
    assert f"policy server(s) ['{url}'] unreachable with 2 of 2 episodes pending" in str(error)
    assert "Connection refused" in str(error)
    assert to_error < 100.0  # well within the batch deadline of 300 s (loose: a loaded 2-core machine)
