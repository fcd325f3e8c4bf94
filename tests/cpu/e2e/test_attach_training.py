# SPDX-License-Identifier: Apache-2.0
"""verl's real `python -m verl.trainer.main_ppo` trains two steps against a NeMo Gym started outside it
(`nemo_gym.attach`); then verl's vLLM server is killed, the job ends naming it, and the attached Gym is left running.

Path under test (nothing replaced; vLLM is its CPU build): a Gym 0.7 started with docs/attach-mode.md's `gym env start`
command (`external_gym.py`; offline venv links are the one difference) running `example_single_tool_call` (a real
`get_weather` call between two model calls); `main_ppo` with the plugin in attach mode: verl's vLLM rollout plays a
scripted tool call and answer (log-probs the model's own), the manager publishes the rollout server's address in Gym's
endpoint file, posts the rows and reads the results through two collect processes (`nemo_gym.collect_processes: 2`), and
the trainer updates the weights the next step's rollout uses. Once step 2 is logged the test SIGKILLs the job's
`vLLMHttpServer` actor (the policy server): the plugin's fault, as users meet it, injected into a running `main_ppo` run
through the launcher, with the demo's console after it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from recipe.nemo_gym_demo.console import JobSpec, run_job
from recipe.nemo_gym_demo.data import UPPERCASE_ROWS, example_rows, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy.episodes import tools_and_games_policy
from tests.support.engine import scripted_overrides
from tests.support.external_gym import ExternalGym
from tests.support.helpers import free_port, kill_processes_with_env, processes_with_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

WEATHER = "example_single_tool_call_simple_agent"
UPPERCASE = "uppercase_share_simple_agent"
WEATHER_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
UPPERCASE_CONFIG = "resources_servers/uppercase_share/configs/uppercase_share.yaml"  # ours, in the repository
MARKER = "NG_TEST_ATTACH_TRAINING"  # in the environment of every process of the job (not of the attached Gym)
POLICY_SERVER = "vLLMHttpServer"  # verl's vLLM server actor: Ray names its process after the class


def script():
    """Weather rows: the scripted tool call and answer (reward 1); uppercase rows: the model's own samples, whose
    graded reward differs between the two samples of a prompt, so GRPO has something to learn from."""
    policy = tools_and_games_policy()
    for rule in policy.rules:
        rule.when.prompt_regex = "get_weather"  # a tool only the weather rows list
    policy.fallback = "model"
    return policy


def rows() -> list[dict]:
    """One weather row and one uppercase row per batch of 2 (data.shuffle=false), for three steps."""
    weather = example_rows([WEATHER])
    uppercase = [json.loads(line) for line in UPPERCASE_ROWS.read_text().splitlines() if line.strip()]
    for row in uppercase:
        row["responses_create_params"]["max_output_tokens"] = 16
    return [row for i in range(3) for row in (weather[i], uppercase[i])]


class KillPolicyAfterStep2:
    """The demo's console (`recipe/nemo_gym_demo/console.py`): printed and kept; once it shows step 2, the job's
    policy server is SIGKILLed (step 3 then needs it)."""

    def __init__(self, marker: str):
        self.marker = marker
        self.lines: list[str] = []
        self.killed: list[int] = []

    def __call__(self, line: str) -> None:
        print(line)
        self.lines.append(line)
        if line.startswith("step 2 ") and not self.killed:
            self.killed += kill_processes_with_env(MARKER, self.marker, POLICY_SERVER)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("attach_main_ppo")
    model_dir = Path(tiny_qwen3_dir())
    gym = ExternalGym.start(
        out / "gym", [WEATHER_CONFIG, UPPERCASE_CONFIG], model_name=str(model_dir), port=free_port()
    )
    try:
        before = gym.pids()
        train = write_jsonl(rows(), out / "train.jsonl")
        plugin = out / "attach.yaml"
        plugin.write_text(
            f"nemo_gym:\n  attach:\n    head_server_url: {gym.url}\n  collect_processes: 2\n"
            "timeouts: {startup_s: 300, batch_s: 900, health_check_interval_s: 2, policy_health_timeout_s: 2}\n"
            "failures: {max_fraction: 0.0}\n"
        )
        spec = JobSpec(
            out_dir=out / "job",
            model_dir=model_dir,
            agent_loop_config=plugin,
            train_files=[train],
            val_files=[train],
            steps=3,
            batch_size=2,
            n=2,
            prompt_length=1024,
            response_length=256,
            lr=1e-2,
            val_before_train=False,
            extra_overrides=(*scripted_overrides(script().to_file(out / "script.json")), "data.shuffle=false"),
        )
        console = KillPolicyAfterStep2(str(out))
        os.environ[MARKER] = console.marker  # the job's processes inherit it; the attached Gym started before
        try:
            result = run_job(spec, console=console)
        finally:
            del os.environ[MARKER]
        yield spec, result, gym, before, gym.pids(), console
    finally:
        gym.stop()


def test_main_ppo_trains_two_steps_against_an_attached_gym(run):
    spec, result, _, _, _, console = run
    assert console.killed, f"step 2 was not reached: {result.cause}; see {spec.log_file}"
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
    # The rows were posted, and the results read into episodes, by the manager's two collect processes.
    log = spec.log_file.read_text(errors="replace")
    assert re.search(r"NeMo Gym: 2 collect processes post the rows and read the results \(pids \d+, \d+;", log)


def test_a_policy_server_killed_while_training_ends_the_job_naming_it_and_leaves_nothing(run):
    spec, result, _, _, _, console = run
    assert result.exit_status == 1 and [s["step"] for s in result.steps] == [1, 2], console.lines
    # The launcher's last lines, then the log: its error is the launcher's report, shown on the console as it came.
    failed = console.lines.index("launch: the trainer failed (exit status 1); its error, from the end of its output:")
    assert console.lines[-1] == f"full log: {spec.log_file}", console.lines
    cause = result.cause
    assert cause == "\n".join(line.removeprefix("launch: ") for line in console.lines[failed + 1 : -1])
    # Whoever notices first names it: the manager's health probes (RolloutAborted naming the URL), or verl, whose
    # call to the server actor fails (Ray's ActorDiedError naming the actor's class); both were seen.
    named_by_manager = cause.startswith("  RolloutAborted: policy server(s) ['http://") and "unreachable" in cause
    named_by_ray = cause.startswith("  ActorDiedError: The actor died") and f"class_name: {POLICY_SERVER}" in cause
    assert named_by_manager or named_by_ray, console.lines
    deadline = time.monotonic() + 20  # the launcher waited for the trainer's process group; the rest must follow
    while (left := processes_with_env(MARKER, console.marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [" ".join(p.cmdline()[:4]) for p in left if p.is_running()] == []


def test_the_attached_gym_outlives_the_trainer(run):
    _, result, gym, before, after, _ = run
    assert result.exit_status == 1  # failed, once its policy server was killed
    assert after == before  # no process of the attached Gym was stopped, and none was added
    from recipe.nemo_gym.gym.over_http.client import HeadClient

    assert {s.name for s in HeadClient("127.0.0.1", gym.port).instances()} >= {WEATHER, "policy_model"}
