# SPDX-License-Identifier: Apache-2.0
"""verl's real `python -m verl.trainer.main_ppo` trains two steps against a NeMo Gym started outside it
(`nemo_gym.attach`), and leaves that Gym running.

Path under test (nothing replaced; vLLM is its CPU build): a Gym 0.7 started with docs/attach-mode.md's `gym env start`
command (`external_gym.py`; offline venv links are the one difference) running `example_single_tool_call` (a real
`get_weather` call between two model calls); `main_ppo` with the plugin in attach mode: verl's vLLM rollout plays a
scripted tool call and answer (log-probs the model's own), the manager publishes the rollout server's address in
Gym's endpoint file, and the trainer updates the weights the next step's rollout uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.nemo_gym_testing.cpu_policy import harness
from recipe.nemo_gym_testing.cpu_policy.episodes import tools_and_games_policy
from recipe.nemo_gym_testing.cpu_policy.tiny_model import tiny_qwen3_dir
from recipe.nemo_gym_testing.cpu_training.job import JobSpec, run_job
from recipe.nemo_gym_testing.demo import UPPERCASE_ROWS
from recipe.nemo_gym_testing.external_gym import ExternalGym
from recipe.nemo_gym_testing.helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

WEATHER = "example_single_tool_call_simple_agent"
UPPERCASE = "uppercase_share_simple_agent"
WEATHER_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
UPPERCASE_CONFIG = "resources_servers/uppercase_share/configs/uppercase_share.yaml"  # ours, in the repository


def script():
    """Weather rows: the scripted tool call and answer (reward 1); uppercase rows: the model's own samples, whose
    graded reward differs between the two samples of a prompt, so GRPO has something to learn from."""
    policy = tools_and_games_policy()
    for rule in policy.rules:
        rule.when.prompt_regex = "get_weather"  # a tool only the weather rows list
    policy.fallback = "model"
    return policy


def rows() -> list[dict]:
    """One weather row and one uppercase row per batch of 2 (data.shuffle=false)."""
    weather = harness.example_rows([WEATHER])
    uppercase = [json.loads(line) for line in UPPERCASE_ROWS.read_text().splitlines() if line.strip()]
    for row in uppercase:
        row["responses_create_params"]["max_output_tokens"] = 16
    return [weather[0], uppercase[0], weather[1], uppercase[1]]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("attach_main_ppo")
    model_dir = Path(tiny_qwen3_dir())
    gym = ExternalGym.start(
        out / "gym", [WEATHER_CONFIG, UPPERCASE_CONFIG], model_name=str(model_dir), port=free_port()
    )
    try:
        before = gym.pids()
        train = harness.write_jsonl(rows(), out / "train.jsonl")
        plugin = out / "attach.yaml"
        plugin.write_text(
            f"nemo_gym:\n  attach:\n    head_server_url: {gym.url}\n"
            "timeouts: {startup_s: 300, batch_s: 900}\nfailures: {max_fraction: 0.0}\n"
        )
        spec = JobSpec(
            out_dir=out / "job",
            model_dir=model_dir,
            agent_loop_config=plugin,
            train_files=[train],
            val_files=[train],
            steps=2,
            batch_size=2,
            n=2,
            prompt_length=1024,
            response_length=256,
            lr=1e-2,
            val_before_train=False,
            script_file=script().to_file(out / "script.json"),
            extra_overrides=("data.shuffle=false",),
        )
        result = run_job(spec, console=print)
        yield spec, result, gym, before, gym.pids()
    finally:
        gym.stop()


def test_main_ppo_trains_two_steps_against_an_attached_gym(run):
    spec, result, _, _, _ = run
    assert result.returncode == 0, f"main_ppo failed: {result.cause}; see {spec.log_file}"
    steps = [s["data"] for s in result.steps if "actor/grad_norm" in s["data"]]
    assert [s["step"] for s in result.steps if "actor/grad_norm" in s["data"]] == [1, 2]
    for data in steps:
        assert data["timing_s/nemo_gym/all/failed"] == 0
        assert data[f"timing_s/nemo_gym/{WEATHER}/episodes"] == 2
        assert data[f"timing_s/nemo_gym/{UPPERCASE}/episodes"] == 2
        # The weather episodes called the tool and answered: Gym's verify gives 1.
        assert data[f"timing_s/nemo_gym/{WEATHER}/reward/mean"] == pytest.approx(1.0)
        # Token-exact through the attached Gym: the actor's log-probs equal the rollout's.
        assert data["training/rollout_probs_diff_max"] < 1e-6
        assert data["actor/grad_norm"] > 0


def test_the_attached_gym_outlives_the_trainer(run):
    _, result, gym, before, after = run
    assert result.returncode == 0
    assert after == before  # no process of the attached Gym was stopped, and none was added
    from recipe.nemo_gym.gym.client import HeadClient

    assert {s.name for s in HeadClient("127.0.0.1", gym.port).instances()} >= {WEATHER, "policy_model"}
