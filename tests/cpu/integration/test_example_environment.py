# SPDX-License-Identifier: Apache-2.0
"""The example environment `uppercase_share` (resources_servers/uppercase_share): its reward, exactly, three ways.

- the pure reward function (`uppercase_share`, `count_uppercase`);
- the server's `verify` called in process (NeMo Gym's request/response models, no HTTP): which text is graded;
- the shipped blend `recipe/nemo_gym/configs/demo_blend.yaml` started offline through the plugin's real runtime
  (`GymServersSpec.from_config` + `GymRuntime.start`, NeMo Gym's own launcher, through test support's
  `start_runtime`), then `/verify` posted straight to the environment's server and rows run end to end through
  its agent against a policy stub that answers with the text a row's prompt asks for. The head server takes a
  free port, not 11000.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import sys
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

from recipe.nemo_gym.config import load_config
from recipe.nemo_gym.gym.launch import GymRuntime
from recipe.nemo_gym.gym.spec import GymServersSpec
from recipe.nemo_gym_testing.gym_imports import restore_process_globals
from recipe.nemo_gym_testing.gym_runtime import collect_blocking, start_runtime
from recipe.nemo_gym_testing.helpers import ChatCompletionStub, chat_completion, free_port, math_row

REPO = Path(__file__).resolve().parents[2]
ENV_DIR = REPO / "resources_servers" / "uppercase_share"
BLEND = REPO / "recipe" / "nemo_gym" / "configs" / "demo_blend.yaml"
AGENT = "uppercase_share_simple_agent"

# (answer, reward, uppercase characters, counted characters): none of the target class, all of it, fractions.
CASES = [
    ("hello world", 0.0, 0, 10),
    ("HELLO WORLD", 1.0, 10, 10),
    ("Hello World", 0.2, 2, 10),
    ("ABcd", 0.5, 2, 4),
    ("  A b\n\tC d  ", 0.5, 2, 4),  # whitespace is not counted
    ("YES, 420!", 0.375, 3, 8),  # digits and punctuation count against the answer
    ("ÀÉ AB", 0.5, 2, 4),  # only ASCII A-Z are capitals here
    ("数字 OK", 0.5, 2, 4),
    ("", 0.0, 0, 0),
    (" \n ", 0.0, 0, 0),
]


@pytest.fixture(scope="module")
def app() -> ModuleType:
    """The server's app.py, loaded from its file as NeMo Gym runs it (a script in its folder, not a package)."""
    spec = importlib.util.spec_from_file_location("uppercase_share_app", ENV_DIR / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through sys.modules
    with restore_process_globals():
        spec.loader.exec_module(module)
    return module


def response_json(*texts: str, extra_items: tuple[dict, ...] = ()) -> dict:
    """A minimal NeMo Gym response whose assistant messages carry `texts` (one message each)."""
    messages = [
        {
            "id": f"msg_{i}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        for i, text in enumerate(texts)
    ]
    return {
        "id": "resp_test",
        "object": "response",
        "created_at": 0.0,
        "model": "tiny-qwen3",
        "output": [*extra_items, *messages],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }


def verify_body(*texts: str, extra_items: tuple[dict, ...] = ()) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Answer in CAPITAL LETTERS only."}]},
        "response": response_json(*texts, extra_items=extra_items),
    }


# ------------------------------------------------------------------------------------------- pure reward


@pytest.mark.parametrize(("text", "reward", "upper", "counted"), CASES)
def test_reward_is_the_share_of_capitals_among_non_whitespace_characters(app, text, reward, upper, counted) -> None:
    assert app.count_uppercase(text) == (upper, counted)
    assert app.uppercase_share(text) == reward


def test_reward_is_graded_and_bounded(app) -> None:
    rewards = [app.uppercase_share("A" * k + "b" * (8 - k)) for k in range(9)]
    assert rewards == [k / 8 for k in range(9)]
    assert all(0.0 <= r <= 1.0 for r in rewards)


# ------------------------------------------------------------------------------------- verify in process


def test_verify_grades_the_assistant_messages_joined_and_reports_the_counts(app) -> None:
    from unittest.mock import MagicMock

    with restore_process_globals():
        from nemo_gym.base_resources_server import BaseVerifyRequest
        from nemo_gym.server_utils import ServerClient

    config = app.UppercaseShareResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="t")
    server = app.UppercaseShareResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
    reasoning = {"id": "rs_0", "type": "reasoning", "summary": [{"type": "summary_text", "text": "lowercase"}]}
    for texts, reward, upper, counted in [
        (("HELLO",), 1.0, 5, 5),
        (("HEL", "lo"), 0.6, 3, 5),  # every assistant message's text, joined
        ((), 0.0, 0, 0),  # no answer at all
    ]:
        body = BaseVerifyRequest.model_validate(verify_body(*texts, extra_items=(reasoning,)))
        out = asyncio.run(server.verify(body))
        assert (out.reward, out.uppercase_chars, out.counted_chars) == (reward, upper, counted)
        assert out.response.output == body.response.output  # the request is echoed back, as NeMo Gym expects


# --------------------------------------------------------------------------- the blend, started for real


class ReplyStub(ChatCompletionStub):
    """vLLM's OpenAI chat server, as NeMo Gym's training model server calls it, answering `REPLY:<text>` prompts.

    The reply is the text after `REPLY:` in the last user message, with made-up token IDs and log-probs
    (`token_id:<n>` strings), and `/tokenize` answers with a fixed prompt.
    """

    def respond(self, body: dict) -> tuple[int, dict]:
        user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        return 200, chat_completion(body, user.split("REPLY:", 1)[1] if "REPLY:" in user else "", (7, 8))


@pytest.fixture(scope="module")
def blend(tmp_path_factory: pytest.TempPathFactory):
    """demo_blend.yaml's servers, started from the repository root as the trainer starts them."""
    tmp = tmp_path_factory.mktemp("blend")
    stub = ReplyStub()
    runtime = None
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(REPO)  # relative config paths and the server folder resolve against the current directory
            spec = GymServersSpec.from_config(
                load_config(BLEND),
                policy_base_urls=[stub.url],
                policy_model_name="tiny-qwen3",
            )
            spec = dataclasses.replace(
                spec, head_server_port=free_port(), cache_dir=tmp / "cache", log_dir=tmp / "logs", startup_timeout_s=300
            )
            runtime = start_runtime(spec)
        yield runtime
    finally:
        if runtime is not None:
            runtime.shutdown()
        stub.close()


def post_verify(runtime: GymRuntime, body: dict) -> dict:
    server = next(s for s in runtime.servers if s.name == "uppercase_share")
    request = urllib.request.Request(
        f"{server.url}/verify", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


@pytest.mark.integration
def test_blend_starts_every_environment_with_ours_among_them(blend: GymRuntime) -> None:
    servers = {
        "policy_model",
        "math_with_judge",
        "math_with_judge_simple_agent",
        "workplace_assistant",
        "workplace_assistant_simple_agent",
        "uppercase_share",
        "uppercase_share_simple_agent",
    }
    if blend.version.startswith("0.7"):  # Gym 0.7's generated relay in front of each agent
        servers |= {f"{e}_environment_server" for e in ("math_with_judge", "workplace_assistant", "uppercase_share")}
    assert {s.name for s in blend.servers} == servers
    assert AGENT in blend.agent_names
    blend.check_health(http_timeout_s=5.0)


@pytest.mark.parametrize(("text", "reward", "upper", "counted"), CASES)
@pytest.mark.integration
def test_verify_endpoint_returns_the_exact_reward(blend: GymRuntime, text, reward, upper, counted) -> None:
    out = post_verify(blend, verify_body(text))
    assert (out["reward"], out["uppercase_chars"], out["counted_chars"]) == (reward, upper, counted)


@pytest.mark.integration
def test_rows_run_end_to_end_through_the_agent_with_exact_rewards(blend: GymRuntime) -> None:
    template = (ENV_DIR / "data" / "example.jsonl").read_text().splitlines()[0]
    replies = ["hello there", "HELLO THERE", "Hello There", "OK ok"]
    batch = []
    for reply in replies:
        row = json.loads(template)
        row["responses_create_params"]["input"][-1]["content"] += f" REPLY:{reply}"
        batch.append(row)
    math = math_row("What is 2+2?", content="What is 2+2? REPLY:\\boxed{4}")
    out = collect_blocking(blend, [*batch, math], deadline_s=120)
    assert [o["reward"] for o in out] == [0.0, 1.0, 0.2, 0.5, 1.0]
    assert [(o["uppercase_chars"], o["counted_chars"]) for o in out[:4]] == [(0, 10), (10, 10), (2, 10), (2, 4)]
    assert out[1]["response"]["output"][-1]["content"][0]["text"] == "HELLO THERE"


def test_shipped_rows_name_our_agent_and_follow_nemo_gyms_layout() -> None:
    train = [json.loads(line) for line in (ENV_DIR / "data" / "train.jsonl").read_text().splitlines()]
    example = [json.loads(line) for line in (ENV_DIR / "data" / "example.jsonl").read_text().splitlines()]
    assert len(example) == 5 and example == train[:5]  # NeMo Gym's `gym env test` wants exactly 5 examples
    assert len(train) == 32
    for row in train:
        assert row["agent_ref"] == {"name": AGENT}
        assert row["responses_create_params"]["input"][-1]["role"] == "user"
    assert (ENV_DIR / "requirements.txt").is_file()  # how NeMo Gym recognises a server folder under the cwd
