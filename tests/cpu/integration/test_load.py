# SPDX-License-Identifier: Apache-2.0
"""The whole stack under load on CPU: 512 concurrent episodes, within connection limits derived from the file limit.

`benchmarks/bench_load.py` runs in a child process (so its RLIMIT_NOFILE can be lowered to 1024 before anything
starts): the real manager (`NeMoGymAgentLoopManager.create`, verl's `LLMServerClient`), NeMo Gym's real tool-calling
example servers, and verl's own vLLM server (the suite's shared engine: standalone rollout on vLLM's CPU build, the
weather episode scripted inside the engine, named by each row). The child reports what it measured with psutil; the
test reads that report and the servers' own logs. A 1024 file limit makes the derived limits bite: 512 episodes are
past the 153 connections per host they allow, so the one run shows both that the limits are taken from the file
limit and that the episodes beyond them queue instead of failing.

The limits formula (`recipe/nemo_gym/gym/over_http/limits.py`) is checked with exact values in
`tests/cpu/unit/gym/test_limits.py`; a trainer that raises or is sent SIGTERM with its manager's Gym up is
`test_manager_lifetime.py`'s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from recipe.nemo_gym.gym.over_http.limits import (
    LIMIT_KEY,
    LIMIT_PER_HOST_KEY,
    derive_connection_limits,
    server_soft_limit,
)
from tests.support.helpers import REPO_ROOT

pytestmark = pytest.mark.integration

BENCH = REPO_ROOT / "benchmarks" / "bench_load.py"
EPISODES = 512
"""Past the 153 connections per host that a 1024 file limit allows (queued, the manager holds under 303 descriptors),
and past 303 by far had they not queued (an unqueued load of 512 held 90% of its episodes' connections at once)."""


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


def _run_load(tmp: Path, policy: Policy, nofile: int) -> dict:
    out = tmp / "report.json"
    cmd = [sys.executable, str(BENCH), "--episodes", str(EPISODES), "--env", "weather", "--json", str(out)]
    cmd += ["--policy-address", policy.address, "--policy-pid", str(policy.pid)]
    cmd += ["--ray-address", policy.ray_address, "--batch-s", "600"]
    cmd += ["--nofile", str(nofile)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_child_env(policy), capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, f"bench_load failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    print(f"\n[bench_load nofile={nofile}, {time.monotonic() - t0:.0f} s in all]\n" + proc.stdout[-3000:])
    return json.loads(out.read_text())


def _assert_batch_complete(report: dict) -> None:
    assert report["output_rows"] == EPISODES
    assert report["failures"] == [] and report["failed_metric"] == 0
    assert report["rewards_match"] and report["reward_sum"] == EPISODES  # every weather episode verified
    assert report["emfile_lines"] == []
    for row in report["processes"]:
        assert row["peak_fds"] < row["soft_nofile"], row


def _expected_keys(soft: int, hard: int) -> dict:
    return derive_connection_limits(soft, hard).as_overrides()


def test_512_concurrent_episodes_complete_within_the_connection_limits_a_1024_file_limit_derives(tmp_path, policy):
    report = _run_load(tmp_path, policy, nofile=1024)
    _assert_batch_complete(report)
    assert report["nofile"] == [1024, 1024]
    expected = _expected_keys(*report["nofile"])
    assert expected == {LIMIT_KEY: 384, LIMIT_PER_HOST_KEY: 153}
    # Every server's client and the manager's took the limits derived from the file limit.
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
    assert report["manager_connector"] == {"limit": 384, "limit_per_host": 153}
    # The servers inherited the lowered limit and kept what NeMo Gym's set_ulimit could make of it ...
    servers_soft = server_soft_limit(*report["nofile"])
    softs = {row["name"]: row["soft_nofile"] for row in report["processes"] if row["name"] != bench.POLICY_SERVER}
    assert softs.pop("manager") == 1024 and set(softs.values()) == {servers_soft}
    # ... and the episodes queued in the manager's connector: at most 153 to the one agent at a time, where 512
    # unqueued would have needed over 512 descriptors in the manager alone.
    manager = next(row for row in report["processes"] if row["name"] == "manager")
    assert manager["peak_fds"] < 153 + 150, manager
    assert not [line for line in Path(policy.log_path).read_text().splitlines() if bench.is_emfile_error(line)]
