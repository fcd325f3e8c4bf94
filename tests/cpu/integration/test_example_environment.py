# SPDX-License-Identifier: Apache-2.0
"""The example environment `uppercase_share` (resources_servers/uppercase_share), its reward exactly, started for
real: the shipped blend `recipe/nemo_gym/configs/demo_blend.yaml` started offline through the plugin's real runtime
(`OwnedGym.start` with the blend's validated YAML, NeMo Gym's own launcher, through test support's
`start_gym`), then `/verify` posted straight to the environment's server and rows run end to end through its
agent against a policy stub that answers with the text a row's prompt asks for. The head server takes a free port,
not 11000.

The pure reward function and `verify` called in process:
`tests/cpu/unit/resources_servers/test_example_environment_units.py`.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from recipe.nemo_gym.config import NeMoGymConfig, load_config
from recipe.nemo_gym.gym.owned.launch import OwnedGym
from tests.support.gym_runtime import collect_blocking, policy_servers, start_gym
from tests.support.helpers import REPO_ROOT as REPO
from tests.support.helpers import ChatCompletionStub, chat_completion, free_port, math_row
from tests.support.uppercase_share import AGENT, ENV_DIR, REWARD_CASES, verify_body

pytestmark = pytest.mark.integration

BLEND = REPO / "recipe" / "nemo_gym" / "configs" / "demo_blend.yaml"


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
            raw = load_config(BLEND).model_dump(exclude_unset=True)
            raw["nemo_gym"] |= {
                "head_server": {"port": free_port()},
                "venv_dir": tmp / "cache" / "nemo_gym_venvs",
                "log_dir": tmp / "logs",
            }
            raw["timeouts"] = {"startup_s": 600}
            runtime = start_gym(NeMoGymConfig.model_validate(raw), policy_servers(stub.url, "tiny-qwen3"))
        yield runtime
    finally:
        if runtime is not None:
            runtime.shutdown()
        stub.close()


def post_verify(runtime: OwnedGym, body: dict) -> dict:
    server = next(s for s in runtime.servers if s.name == "uppercase_share")
    request = urllib.request.Request(
        f"{server.url}/verify", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_blend_starts_every_environment_with_ours_among_them(blend: OwnedGym) -> None:
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
    assert AGENT in blend.connection.agent_names
    blend.check_health(http_timeout_s=5.0)


@pytest.mark.parametrize(("text", "reward", "upper", "counted"), REWARD_CASES)
def test_verify_endpoint_returns_the_exact_reward(blend: OwnedGym, text, reward, upper, counted) -> None:
    out = post_verify(blend, verify_body(text))
    assert (out["reward"], out["uppercase_chars"], out["counted_chars"]) == (reward, upper, counted)


def test_rows_run_end_to_end_through_the_agent_with_exact_rewards(blend: OwnedGym) -> None:
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
