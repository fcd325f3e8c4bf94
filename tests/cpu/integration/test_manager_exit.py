# SPDX-License-Identifier: Apache-2.0
"""A trainer that exits without calling the manager's `shutdown()` (verl 0.9.1's never does) leaves no NeMo Gym
process behind and prints no error.

Each test runs a child process that creates the real manager with verl's own `create(...)` call (verl's
`LLMServerClient`, NeMo Gym's math servers from the wheel), runs one training batch (so NeMo Gym's HTTP session
exists), records the pids of every NeMo Gym process, and exits:
- `script`: the trainer script simply returns (interpreter exit: atexit);
- `task_runner`: as verl's `main_ppo` runs it, the manager lives in a Ray actor (the TaskRunner) that nothing
  terminates; the driver gets the actor's result and exits, and Ray then ends the actor (SIGTERM, then SIGKILL
  about 0.1 s later: no atexit runs in the actor).

The one stand-in: the policy server is the test support's `PolicyStub` (`tests/support/gym_runtime.py`, through
`tests/cpu/conftest.py`'s `policy_stub_address`: vLLM's OpenAI server as Gym's model server calls it, answering each
math row with the number its prompt names), not verl's vLLM server. What is under test is the manager's Gym and its
end, not the tokens; with verl's server this module would run on the worker that runs the suite's engine and
trainers (`tests/cpu/conftest.py`), whose modules are the suite's wall time.
The tokens of real episodes through the manager are `test_end_to_end.py`'s.

A start that fails once NeMo Gym is up, and a trainer that raises or is sent SIGTERM before any batch, are
`test_manager_lifetime.py`'s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.gym_runtime import stub_math_row, write_math_plugin
from tests.support.helpers import alive, free_port, nemo_gym_processes

CHILD = r"""
import json, sys
from pathlib import Path

import ray

from recipe.nemo_gym.agent_loop import NeMoGymAgentLoopManager
from tests.support.cpu_policy import harness
from recipe.nemo_gym.dataset import NeMoGymJSONLDataset

tmp, address, model_dir, mode, ray_dir = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
KEEP = []  # the trainer holds its manager until it exits


def run_one_batch():
    overrides = harness.cpu_trainer_overrides(
        model_dir, tmp / "plugin.yaml", prompt_length=1024, response_length=64, n=1, batch_size=2
    )
    config = harness.compose_verl_config(overrides)
    rows = [str(tmp / "rows.jsonl")]
    dataset = NeMoGymJSONLDataset(data_files=rows, tokenizer=None, processor=None, config=config.data)
    manager = NeMoGymAgentLoopManager.create(
        config=config, llm_client=harness.verl_llm_client(config, [address]), teacher_client=None,
        reward_loop_worker_handles=None,
    )
    KEEP.append(manager)
    _, batch = harness.trainer_batches(dataset, [0, 1], config)
    output = manager.generate_sequences(batch)
    assert output.batch["rm_scores"].sum().item() == 2.0
    return sorted(manager._gym.pids())


if mode == "script":
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
    pids = run_one_batch()
    (tmp / "pids.json").write_text(json.dumps(pids))
    # The trainer returns without calling manager.shutdown(): the interpreter exits.
else:
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=ray_dir)

    @ray.remote
    class TaskRunner:
        def run(self):
            import os
            return os.getpid(), run_one_batch()

    runner = TaskRunner.remote()
    actor_pid, pids = ray.get(runner.run.remote())  # verl's run_ppo: ray.get(runner.run.remote(config))
    (tmp / "pids.json").write_text(json.dumps(pids))
    (tmp / "actor_pid").write_text(str(actor_pid))
    # run_ppo returns, main_ppo's driver exits; nothing terminates the TaskRunner actor explicitly.
"""

pytestmark = pytest.mark.integration

PROBLEM_WORDS = ("Traceback", "Error", "Exception")


@dataclass(frozen=True)
class ChildRun:
    returncode: int
    stderr: str
    pids: list[int]  # every NeMo Gym process the manager had started (wrappers and servers)
    head_port: int
    exited: float  # time.monotonic() when the child had exited


def run_child(tmp_path: Path, ray_dir: Path, policy_address: str, mode: str, *, log_dir: bool) -> ChildRun:
    """Run the child to its exit. Its output goes to files, not pipes: a pipe would make this wait for every
    process that inherited it (the NeMo Gym servers), hiding the very survivors the tests look for."""
    model_dir, port = tiny_qwen3_dir(), free_port()
    write_math_plugin(tmp_path / "plugin.yaml", port, log_dir=tmp_path / "gym_logs" if log_dir else None)
    rows = [stub_math_row(q, "4", answer="4") for q in ("What is 2+2?", "What is 3+1?")]
    write_jsonl(rows, tmp_path / "rows.jsonl")
    env = {**os.environ, "PYTHONPATH": str(harness.REPO_ROOT)}  # the Ray actor imports the recipe too
    env.setdefault("RAY_raylet_start_wait_time_s", "120")  # Ray's 10 s start-up limit is short on a loaded CI box
    argv = [sys.executable, "-c", CHILD, str(tmp_path), policy_address, str(model_dir), mode]
    with open(tmp_path / "stdout.txt", "wb") as out, open(tmp_path / "stderr.txt", "wb") as err:
        child = subprocess.run(
            [*argv, str(ray_dir)], cwd=harness.REPO_ROOT, env=env, stdout=out, stderr=err, timeout=540
        )
    exited = time.monotonic()
    pids = json.loads((tmp_path / "pids.json").read_text()) if (tmp_path / "pids.json").exists() else []
    stderr = (tmp_path / "stderr.txt").read_text(errors="replace")
    return ChildRun(child.returncode, stderr, pids, port, exited)


def survivors_after(run: ChildRun, seconds: float, also: Sequence[int] = ()) -> list[int]:
    """The processes of `run.pids` (and `also`) still alive `seconds` after the child exited.

    A NeMo Gym server whose Ray goes away exits by itself after 60 s of failed GCS reconnects: a bound under 60 s
    checks the plugin's own teardown, not that backstop.
    """
    deadline = run.exited + seconds
    while (alive(run.pids) or alive(list(also))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive([*run.pids, *also])


def problem_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(word in line for word in PROBLEM_WORDS)]


@pytest.fixture
def ray_dir():
    """Ray's temp folder for the child: short, since Ray's socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ngexit-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_trainer_script_exit_without_shutdown_stops_every_nemo_gym_process_silently(
    tmp_path, ray_dir, policy_stub_address
):
    # No log_dir: the servers write to the trainer's own stderr, so their exit is checked for errors too.
    run = run_child(tmp_path, ray_dir, policy_stub_address, "script", log_dir=False)
    assert run.returncode == 0, run.stderr[-5000:]
    assert len(run.pids) >= 3  # the model server, the math server and its agent (with their wrappers)
    assert survivors_after(run, 20.0) == [], "NeMo Gym processes outlived the trainer"
    assert nemo_gym_processes(run.head_port) == []
    assert problem_lines(run.stderr) == [], run.stderr[-5000:]


def test_task_runner_actor_ended_by_ray_after_main_ppo_returns_stops_every_nemo_gym_process(
    tmp_path, ray_dir, policy_stub_address
):
    # With log_dir, as the submit scripts run it: each server runs under a `| tee` pipeline.
    run = run_child(tmp_path, ray_dir, policy_stub_address, "task_runner", log_dir=True)
    assert run.returncode == 0, run.stderr[-5000:]
    assert len(run.pids) >= 3
    actor_pid = int((tmp_path / "actor_pid").read_text())
    # When Ray ends the actor with SIGTERM, its handler SIGKILLs every server at once; when Ray's SIGKILL comes
    # first (seen in 2 of about 6 full-suite runs on a loaded 2-core machine), the runtime's watchdog does.
    survivors = survivors_after(run, 30.0, also=[actor_pid])
    assert actor_pid not in survivors, "Ray did not end the TaskRunner actor"
    assert survivors == [], "NeMo Gym processes outlived the TaskRunner actor"
    assert nemo_gym_processes(run.head_port) == []
    assert problem_lines(run.stderr) == [], run.stderr[-5000:]
    worker_logs = list(ray_dir.glob(f"session_*/logs/worker-*-{actor_pid}.err"))
    assert worker_logs, "the actor's stderr log was not found"
    assert problem_lines(worker_logs[0].read_text(errors="replace")) == [], worker_logs[0].read_text()[-5000:]
