# SPDX-License-Identifier: Apache-2.0
"""The manager's NeMo Gym around a trainer that never gets to a batch: a start that fails once Gym runs, and a
trainer that raises or is sent SIGTERM while its manager holds a started Gym. No NeMo Gym process may outlive any
of them.

The manager is the real one, created by verl's own `create(...)` call over verl's `LLMServerClient`, with NeMo Gym's
math servers from the wheel. No episode runs in these tests: the manager only asks its policy server for its
model at start, so the policy is the test support's `PolicyStub` (`tests/cpu/conftest.py`'s `policy_stub_address`),
not verl's vLLM server, which keeps this module off the worker that runs the suite's engine and trainers. The same
exits after a batch are `test_manager_exit.py`'s; the runtime's own hooks (SIGTERM chained, SIGKILL, interpreter
exit) are `test_gym_runtime.py`'s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from recipe.nemo_gym.data_check import DataFilesError
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.gym_runtime import write_math_plugin
from tests.support.helpers import REPO_ROOT, alive, free_port, math_row, nemo_gym_processes

pytestmark = pytest.mark.integration


def _sizes(plugin: Path) -> list[str]:
    return harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), plugin, prompt_length=1024, response_length=64, n=1, batch_size=2
    )


def test_a_row_naming_no_agent_of_the_running_gym_fails_the_start_listing_it_and_gym_is_stopped(
    tmp_path, ray_address, policy_stub_address
):
    port = free_port()
    plugin = write_math_plugin(tmp_path / "plugin.yaml", port)
    unknown = {**math_row("What is 3+1?"), "agent_ref": {"name": "wordle_simple_agent"}}
    data = write_jsonl([math_row("What is 2+2?"), unknown], tmp_path / "rows.jsonl")
    config = harness.compose_verl_config([*_sizes(plugin), f"data.train_files=[{data}]", f"data.val_files=[{data}]"])
    client = harness.verl_llm_client(config, [policy_stub_address])
    # The dataset's own check, as verl builds it, passes (JSON and fields); the manager's, once Gym runs, does not.
    with pytest.raises(DataFilesError) as raised, harness.manager_over(config, client):
        pass
    assert str(raised.value).splitlines() == [
        f"1 of 2 rows in {data} cannot be trained on; nothing was trained. Fix or remove them:",
        f"  {data}:2: agent_ref.name 'wordle_simple_agent' is not an agent of the configured environments "
        "['math_with_judge_simple_agent']",
    ]
    deadline = time.monotonic() + 10
    while nemo_gym_processes(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert nemo_gym_processes(port) == []


# ------------------------------------------------------------------------------ the trainer fails or is killed

CHILD = """
import sys, time
from pathlib import Path

import ray

from recipe.nemo_gym.agent_loop import NeMoGymAgentLoopManager
from tests.support.cpu_policy import harness
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir

tmp, ray_address, policy_address = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
config = harness.compose_verl_config(
    harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), tmp / "plugin.yaml", prompt_length=1024, response_length=256, n=1, batch_size=1
    )
)
ray.init(address=ray_address, log_to_driver=False)
manager = NeMoGymAgentLoopManager.create(
    config=config, llm_client=harness.verl_llm_client(config, [policy_address]), teacher_client=None,
    reward_loop_worker_handles=None,
)
(tmp / "ready").write_text("")
while not (tmp / "raise_now").exists():
    time.sleep(0.1)
raise RuntimeError("trainer step failed")  # as a failing training step would: nobody calls shutdown()
"""


def _start_trainer(tmp: Path, ray_address: str, policy_address: str) -> tuple[psutil.Popen, int, list[int]]:
    """A trainer process (joining the module's Ray, as `main_ppo`'s driver joins its own) whose manager has started
    NeMo Gym's math environment. Returns it, the head port and its descendants once Gym is up."""
    head_port = free_port()
    write_math_plugin(tmp / "plugin.yaml", head_port)
    child = psutil.Popen(
        [sys.executable, "-c", CHILD, str(tmp), ray_address, policy_address],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not (tmp / "ready").exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            _, err = child.communicate(timeout=30)
            pytest.fail(f"the trainer child never got its manager up (rc {child.returncode}):\n{err[-6000:]}")
        time.sleep(0.2)
    family = [p.pid for p in child.children(recursive=True)]
    servers = [p.pid for p in nemo_gym_processes(head_port)]
    assert len(servers) >= 3, servers  # model server, resources server, agent
    assert set(servers) <= set(family)
    return child, head_port, family


def _reap(child: psutil.Popen, pids) -> tuple[int, str]:
    try:
        _, err = child.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate(timeout=30)
    survivors = alive(pids)
    for pid in survivors:  # leave the machine clean whatever the assertions below say
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    return child.returncode, err


def test_an_exception_in_the_trainer_leaves_no_nemo_gym_process(tmp_path, ray_address, policy_stub_address):
    child, head_port, family = _start_trainer(tmp_path, ray_address, policy_stub_address)
    (tmp_path / "raise_now").write_text("")
    code, err = _reap(child, family)
    assert code == 1 and "RuntimeError: trainer step failed" in err, err[-3000:]
    assert alive(family) == []
    assert nemo_gym_processes(head_port) == []


def test_sigterm_to_the_trainer_leaves_no_nemo_gym_process(tmp_path, ray_address, policy_stub_address):
    child, head_port, family = _start_trainer(tmp_path, ray_address, policy_stub_address)
    child.send_signal(signal.SIGTERM)
    code, err = _reap(child, family)
    # The runtime's hook stopped the servers, then chained to the handler before it: Ray's driver handler, which
    # exits with the signal number.
    assert code == signal.SIGTERM, err[-3000:]
    assert alive(family) == []
    assert nemo_gym_processes(head_port) == []
