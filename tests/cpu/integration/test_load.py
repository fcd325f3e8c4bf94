# SPDX-License-Identifier: Apache-2.0
"""Load and lifetime of the whole stack on CPU: connection limits from the file limit, 512 concurrent episodes,
and no NeMo Gym or policy-server process left after the trainer fails.

- The limits formula (`recipe/nemo_gym/limits.py`) is checked with exact values in `tests/cpu/unit/test_limits.py`.
- Load: `benchmarks/bench_load.py` runs in a child process (so its RLIMIT_NOFILE can be lowered before anything
  starts): the real manager (`NeMoGymAgentLoopManager.create`, verl's `LLMServerClient`), NeMo Gym's real
  tool-calling example servers, and verl's own vLLM server (the suite's shared engine: standalone rollout on
  vLLM's CPU build, the weather episode scripted inside the engine, named by each row). The child reports what it
  measured with psutil; the test reads that report and the servers' own logs.
- Shutdown: a child creates the manager over that server and then raises, as a trainer step would, or is sent
  SIGTERM; the test finds every process by the process list (psutil), not by the child's word. (The vLLM server's
  own lifetime is verl's: `test_main_ppo` checks that nothing of the engine outlives a `main_ppo` run.)
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from recipe.nemo_gym.limits import LIMIT_KEY, LIMIT_PER_HOST_KEY, derive_connection_limits, server_soft_limit
from tests.support.helpers import REPO_ROOT, alive, free_port, nemo_gym_processes

pytestmark = pytest.mark.integration

BENCH = REPO_ROOT / "benchmarks" / "bench_load.py"
EPISODES = 512
QUEUED_EPISODES = 384
"""The 1024-file-limit load: past its 153 connections per host (queued, the manager holds under 303 descriptors),
and past 303 by far had they not queued (the first load held 90% of its episodes' connections at once)."""


# ------------------------------------------------------------------------------------ the stack, in children


def _load_bench():
    """benchmarks/bench_load.py as a module, loaded from its file: NeMo Gym's wheel owns the top-level name
    `benchmarks`, so the folder cannot be imported as a package."""
    spec = importlib.util.spec_from_file_location("bench_load", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def _child_env(policy: Policy) -> dict[str, str]:
    env = {**os.environ, **policy.ray_env}  # the children join the policy's Ray
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@dataclass(frozen=True)
class Policy:
    address: str  # "host:port" of verl's vLLM server
    pid: int  # its `vLLMHttpServer` actor's process
    log_path: Path  # that actor's stderr in Ray's logs
    ray_address: str  # the local Ray it runs in, which the children join
    ray_env: dict[str, str]  # what a process joining that Ray needs in its environment


@pytest.fixture(scope="module")
def policy(shared_engine):
    """verl's vLLM server: the suite's shared engine (one standalone replica on vLLM's CPU build, 256 sequences in
    its batch); every row of the load names the weather episode's script."""
    engine = shared_engine
    return Policy(engine.address, engine.server_pid, Path(engine.server_log), engine.ray_address, engine.ray_env)


def _run_load(tmp: Path, policy: Policy, nofile: int | None, episodes: int = EPISODES) -> dict:
    out = tmp / "report.json"
    cmd = [sys.executable, str(BENCH), "--episodes", str(episodes), "--env", "weather", "--json", str(out)]
    cmd += ["--policy-address", policy.address, "--policy-pid", str(policy.pid)]
    cmd += ["--ray-address", policy.ray_address, "--batch-s", "600"]
    if nofile is not None:
        cmd += ["--nofile", str(nofile)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_child_env(policy), capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, f"bench_load failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    print(f"\n[bench_load nofile={nofile}, {time.monotonic() - t0:.0f} s in all]\n" + proc.stdout[-3000:])
    return json.loads(out.read_text())


def _assert_batch_complete(report: dict, episodes: int = EPISODES) -> None:
    assert report["output_rows"] == episodes
    assert report["failures"] == [] and report["failed_metric"] == 0
    assert report["rewards_match"] and report["reward_sum"] == episodes  # every weather episode verified
    assert report["emfile_lines"] == []
    for row in report["processes"]:
        assert row["peak_fds"] < row["soft_nofile"], row


def _expected_keys(soft: int, hard: int) -> dict:
    return derive_connection_limits(soft, hard).as_overrides()


def test_512_concurrent_episodes_complete_with_connection_limits_from_the_file_limit(tmp_path, policy):
    report = _run_load(tmp_path, policy, nofile=None)
    _assert_batch_complete(report)
    soft, hard = report["nofile"]
    expected = _expected_keys(soft, hard)
    relay = {"example_single_tool_call_environment_server"} if report["gym_version"].startswith("0.7") else set()
    assert (
        set(report["server_connector_limits"])
        == {
            "policy_model",
            "example_single_tool_call",
            "example_single_tool_call_simple_agent",
        }
        | relay
    )
    assert all(keys == expected for keys in report["server_connector_limits"].values())
    assert report["manager_connector"] == {"limit": expected[LIMIT_KEY], "limit_per_host": expected[LIMIT_PER_HOST_KEY]}
    manager = next(row for row in report["processes"] if row["name"] == "manager")
    # Nothing held the batch back: the manager had (nearly) all 512 episodes' connections open at once.
    assert manager["peak_fds"] >= EPISODES * 0.9, manager
    assert not [line for line in Path(policy.log_path).read_text().splitlines() if bench.is_emfile_error(line)]


def test_with_a_1024_file_limit_the_derived_limits_queue_instead_of_failing(tmp_path, policy):
    report = _run_load(tmp_path, policy, nofile=1024, episodes=QUEUED_EPISODES)
    _assert_batch_complete(report, QUEUED_EPISODES)
    assert report["nofile"] == [1024, 1024]
    expected = _expected_keys(*report["nofile"])
    assert expected == {LIMIT_KEY: 384, LIMIT_PER_HOST_KEY: 153}
    assert all(keys == expected for keys in report["server_connector_limits"].values())
    assert report["manager_connector"] == {"limit": 384, "limit_per_host": 153}
    # The servers inherited the lowered limit and kept what NeMo Gym's set_ulimit could make of it ...
    servers_soft = server_soft_limit(*report["nofile"])
    softs = {row["name"]: row["soft_nofile"] for row in report["processes"] if row["name"] != bench.POLICY_SERVER}
    assert softs.pop("manager") == 1024 and set(softs.values()) == {servers_soft}
    # ... and the episodes queued in the manager's connector: at most 153 to the one agent at a time.
    manager = next(row for row in report["processes"] if row["name"] == "manager")
    assert manager["peak_fds"] < 153 + 150, manager


# ------------------------------------------------------------------------------ the trainer fails or is killed

CHILD = """
import json, sys, time
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


def _start_trainer(tmp: Path, policy: Policy):
    head_port = free_port()
    env = bench.ENVIRONMENTS["weather"]
    bench.plugin_yaml(
        tmp / "plugin.yaml", env, head_port=head_port, log_dir=tmp / "logs", batch_s=60, default_limits=False
    )
    child = psutil.Popen(
        [sys.executable, "-c", CHILD, str(tmp), policy.ray_address, policy.address],
        cwd=REPO_ROOT,
        env=_child_env(policy),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not (tmp / "ready").exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            out, err = child.communicate(timeout=30)
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


def test_an_exception_in_the_trainer_leaves_no_nemo_gym_process(tmp_path, policy):
    child, head_port, family = _start_trainer(tmp_path, policy)
    (tmp_path / "raise_now").write_text("")
    code, err = _reap(child, family)
    assert code == 1 and "RuntimeError: trainer step failed" in err, err[-3000:]
    assert alive(family) == []
    assert nemo_gym_processes(head_port) == []
    assert alive([policy.pid]) == [policy.pid]  # the policy server is verl's: the manager never stops it


def test_sigterm_to_the_trainer_leaves_no_nemo_gym_process(tmp_path, policy):
    child, head_port, family = _start_trainer(tmp_path, policy)
    child.send_signal(signal.SIGTERM)
    code, err = _reap(child, family)
    # The runtime's hook stopped the servers, then chained to the handler before it: Ray's driver handler, which
    # exits with the signal number.
    assert code == signal.SIGTERM, err[-3000:]
    assert alive(family) == []
    assert nemo_gym_processes(head_port) == []
