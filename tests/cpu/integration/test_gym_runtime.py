# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym's real servers under the plugin (`OwnedGym`), out of process: start, health, ordered rollouts, shutdown.

The servers are those of the Gym environment the plugin runs (`.venv-gym`, Gym 0.7, unless `NEMO_GYM_ENV` names
another: the suite runs this module on 0.4.0 too): `workplace_assistant`, `math_with_judge` with the judge off,
their `simple_agent`s, 0.7's environment servers in front of them, the training `vllm_model`, started by Gym's own
launcher under the plugin's lean private Ray (`lean_ray.py`). The stand-ins: in one test, a few lines in place of
Gym's launcher under `lean_ray.py` (to end it at will); and the policy, a small HTTP server that answers
`/v1/chat/completions` and `/tokenize` the way verl's vLLM server does (its real engine is too slow for these
tests' many batches), steered per request by markers in the prompt (answer, delay, HTTP 500, hang).

The tests that kill servers or shut the stack down get a stack of their own (`own_stack`), so the tests pass
in any order; in file order they come last and take the shared one. The pure parts (config paths, the config Gym
is handed, run targets, the batch core, the event loop) are tested in the unit tier, a module each
(`tests/cpu/unit/gym/`: `test_gym_layout.py`, `test_global_config.py`, `test_client.py`, `test_collect.py`,
`test_owned_launch.py`; `tests/cpu/unit/test_event_loop.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.failures import EpisodeFailure, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.errors import GymServerDied, GymStartTimeout, HeadPortInUseError
from recipe.nemo_gym.gym.over_http.client import HeadClient
from recipe.nemo_gym.gym.owned import launch
from recipe.nemo_gym.gym.owned.environment import LEAN_RAY, clean_environment, inspect_environment, locate_environment
from recipe.nemo_gym.gym.owned.launch import OwnedGym, check_port_free
from recipe.nemo_gym.metrics import environment_metrics
from recipe.nemo_gym.packing.batch import BatchPacker
from recipe.nemo_gym.packing.episode import episode_from_result
from recipe.nemo_gym.ray_start import missed_ray_start
from tests.support.gym_runtime import MATH_CONFIG as MATH
from tests.support.gym_runtime import WORKPLACE_CONFIG as WORKPLACE
from tests.support.gym_runtime import (
    PolicyStub,
    collect_blocking,
    gym_config,
    gym_processes,
    policy_servers,
    start_gym,
)
from tests.support.gym_runtime import stub_math_row as math_row
from tests.support.helpers import (
    GYM_ENVS,
    REPO_ROOT,
    SharedStack,
    free_port,
    processes_with_env,
    workplace_row,
)

pytestmark = pytest.mark.integration

SERVER_NAMES = {
    "policy_model",
    "workplace_assistant",
    "workplace_assistant_simple_agent",
    "math_with_judge",
    "math_with_judge_simple_agent",
}
# Gym 0.7 puts a generated `legacy_agent` relay in front of each agent the configs leave without one.
RELAYS = {"workplace_assistant_environment_server", "math_with_judge_environment_server"}


def expected_servers(runtime: OwnedGym) -> set[str]:
    return SERVER_NAMES | (RELAYS if runtime.version.startswith("0.7") else set())


def server_process(runtime: OwnedGym, name: str) -> psutil.Process:
    """The Python process of one server (`app.py`), under the process Gym reported for it."""
    wrapper = psutil.Process(next(s.pid for s in runtime.servers if s.name == name))
    return next(p for p in [wrapper, *wrapper.children(recursive=True)] if "app.py" in " ".join(p.cmdline()))


def config_for(tmp: Path, head_port: int, startup_s: float = 600.0, **nemo_gym) -> NeMoGymConfig:
    """The workplace and math environments, their servers' venv links under `tmp`."""
    venvs = tmp / "cache" / "nemo_gym_venvs"
    return gym_config((WORKPLACE, MATH), head_port, timeouts={"startup_s": startup_s}, venv_dir=venvs, **nemo_gym)


# ---------------------------------------------------------------------------------- real NeMo Gym servers


@pytest.fixture(scope="module")
def policy():
    stub = PolicyStub()
    yield stub
    stub.close()


def test_start_with_head_port_in_use_names_it_and_starts_nothing(tmp_path: Path, no_live_stack: None) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = config_for(tmp_path, port)
        with pytest.raises(HeadPortInUseError, match=rf"head server port 127.0.0.1:{port} is already in use"):
            start_gym(config, policy_servers("http://127.0.0.1:9/v1"))
        assert gym_processes(port) == []
        assert not list((tmp_path / "cache").glob("**/.venv"))


def test_a_head_port_taken_after_its_check_ends_start_up_naming_the_port_and_leaves_no_process(
    tmp_path: Path, no_live_stack: None, monkeypatch
) -> None:
    """Another process takes the head port between the plugin's check and Gym's bind (in CI, a port picked by
    `bind(0)`: Gym's own Ray, started first, may take any such port). Gym 0.7's launcher would wait for its head
    server forever; the plugin reads the bind error in its log and ends the start at once. The stand-in for the
    other process is a socket the test binds right after the real check, at each start: a start whose Gym's Ray
    missed Ray's start-up deadline is tried again, and checks the port again."""
    port = free_port()
    takers: list[socket.socket] = []

    def check_then_take(host: str, checked: int) -> None:
        while takers:  # free at each check, taken right after it
            takers.pop().close()
        check_port_free(host, checked)
        taker = socket.socket()
        taker.bind((host, checked))  # no SO_REUSEADDR and no listen: like a connection's local port
        takers.append(taker)

    monkeypatch.setattr(launch, "check_port_free", check_then_take)
    try:
        with pytest.raises(GymServerDied) as err:
            start_gym(config_for(tmp_path, port, startup_s=120.0), policy_servers("http://127.0.0.1:9/v1"))
    finally:
        for taker in takers:
            taker.close()
    assert list(err.value.servers) == ["head_server"]
    message = str(err.value)
    assert f"head server could not listen on 127.0.0.1:{port} during start-up" in message
    assert f"error while attempting to bind on address ('127.0.0.1', {port})" in message
    assert "address already in use" in message
    assert "another process took it meanwhile" in message
    assert gym_processes(port) == []


def test_start_that_misses_its_deadline_names_servers_and_leaves_no_process(
    tmp_path: Path, no_live_stack: None
) -> None:
    port = free_port()
    config = config_for(tmp_path, port, startup_s=4.0)
    t0 = time.monotonic()
    with pytest.raises(GymStartTimeout) as err:
        start_gym(config, policy_servers("http://127.0.0.1:9/v1"))
    assert time.monotonic() - t0 < 4.0 + 60.0  # deadline, then a bounded teardown (loose: a loaded 2-core box)
    assert "not ready within 4s" in str(err.value)
    assert set(err.value.servers) <= SERVER_NAMES | RELAYS | {"head_server"} and err.value.servers
    assert gym_processes(port) == []
    check_port_free("127.0.0.1", port)


CHILD = """
import os, signal, sys, threading, time
from pathlib import Path
from tests.support.gym_runtime import gym_config, policy_servers, start_gym

port, tmp, mode = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
config = gym_config(
    ["resources_servers/math_with_judge/configs/math_with_judge.yaml"], port,
    timeouts={"startup_s": 600}, venv_dir=tmp / "cache" / "nemo_gym_venvs",
)
policy = policy_servers("http://127.0.0.1:9/v1", "m")
if mode == "sigterm":
    def previous(signum, frame):
        (tmp / "previous_handler_ran").write_text(str(signum))
        os._exit(0)  # no atexit, no unwinding: only the runtime's SIGTERM hook can have stopped the servers
    signal.signal(signal.SIGTERM, previous)
    start_gym(config, policy)  # servers start; the test sends SIGTERM while they come up
elif mode == "sigkill":
    start_gym(config, policy)
    time.sleep(600)  # the test SIGKILLs this process: no handler, no atexit runs
else:
    threading.Thread(target=start_gym, args=(config, policy), daemon=True).start()
    while not (tmp / "exit_now").exists():
        time.sleep(0.1)
    # The trainer's side of Gym, started: no module of NeMo Gym's was imported into this process.
    (tmp / "nemo_gym_modules").write_text(" ".join(m for m in sys.modules if m.split(".")[0] == "nemo_gym"))
    # a normal interpreter exit: atexit must stop the servers
"""
MARK = "NG_TEST_GYM_TREE"


def gym_tree(mark: str) -> list[psutil.Process]:
    """Every live process of the Gym a test started with `MARK=mark` in its environment: the launcher, the servers,
    Gym's own Ray (each inherits the launcher's environment)."""
    return processes_with_env(MARK, mark)


def run_dirs_of(port: int) -> list[Path]:
    """The private run folders (`/tmp/ng-gym-*`) whose job config names this head port."""
    found = []
    for folder in Path("/tmp").glob("ng-gym-*"):
        with contextlib.suppress(OSError):
            if f"port: {port}" in (folder / "verl_job.yaml").read_text():
                found.append(folder)
    return found


def wait_until_gone(mark: str, timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while gym_tree(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    return gym_tree(mark)


def _run_child_until_servers_exist(tmp_path: Path, mode: str) -> tuple[psutil.Popen, int, str]:
    port, mark = free_port(), f"{mode}-{time.monotonic_ns()}"
    child = psutil.Popen(
        [sys.executable, "-c", CHILD, str(port), str(tmp_path), mode],
        cwd=REPO_ROOT,
        env={**os.environ, MARK: mark},
    )
    # Room for the starts `OwnedGym.start` may make on a busy machine (Ray's 30 s start-up deadline missed, up to
    # `RAY_START_ATTEMPTS` starts in all).
    deadline = time.monotonic() + 300
    while len(gym_processes(port)) < 3 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.2)
    assert child.poll() is None, f"the child ended (exit status {child.returncode}) before its servers started"
    assert len(gym_processes(port)) >= 3, "the child never launched its servers"
    return child, port, mark


# `lean_ray.py` in front of a stand-in launcher (a few lines of Python that report their arguments, then end as told):
# what it hands the launcher, and how it ends.
STAND_IN_LAUNCHER = """
import os, signal, sys
print("launcher args:", sys.argv[1:], flush=True)
how = os.environ["STAND_IN_END"]
if how == "SIGTERM":
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(how))
"""


@pytest.mark.parametrize("end", ["3", "SIGTERM"])
def test_lean_ray_hands_the_launcher_its_rays_address_and_ends_as_the_launcher_ended(end: str) -> None:
    python = str(inspect_environment(locate_environment(None)).python)
    # As the plugin does, a start whose Ray missed Ray's fixed start-up deadline (a loaded machine) is tried again.
    for _ in range(launch.RAY_START_ATTEMPTS):
        # A short folder for Ray's sockets (107 bytes at most), as OwnedGym gives it.
        with tempfile.TemporaryDirectory(prefix="lr-") as ray_tmp:
            env = {**clean_environment(os.environ), "RAY_TMPDIR": ray_tmp, "STAND_IN_END": end}
            holder = subprocess.run(
                [python, str(LEAN_RAY), python, "-c", STAND_IN_LAUNCHER, "+config_paths=[a.yaml]"],
                env=env, capture_output=True, text=True, timeout=120, start_new_session=True,
            )  # fmt: skip
            ray_left = [p.pid for p in psutil.process_iter(["cmdline"]) if ray_tmp in " ".join(p.info["cmdline"] or [])]
        if not missed_ray_start(holder.stderr):
            break
    args = re.search(r"launcher args: \[(.*)\]", holder.stdout)
    assert args, holder.stdout + holder.stderr
    given, address = args.group(1).split(", ")
    assert given == "'+config_paths=[a.yaml]'"
    assert re.fullmatch(r"\"\+ray_head_node_address='[0-9.]+:[0-9]+'\"", address), address
    assert holder.returncode == (-signal.SIGTERM if end == "SIGTERM" else 3), holder.stderr[-3000:]
    assert ray_left == []  # lean_ray.py stopped its Ray before it ended


def test_sigterm_of_the_trainer_stops_servers_and_chains_the_previous_handler(tmp_path: Path) -> None:
    child, port, mark = _run_child_until_servers_exist(tmp_path, "sigterm")
    child.terminate()
    assert child.wait(60) == 0
    assert (tmp_path / "previous_handler_ran").read_text() == str(int(signal.SIGTERM))
    assert wait_until_gone(mark, 15) == []
    assert run_dirs_of(port) == []


def test_sigkill_of_the_trainer_leaves_no_gym_process(tmp_path: Path) -> None:
    child, port, mark = _run_child_until_servers_exist(tmp_path, "sigkill")
    time.sleep(1.0)  # the runtime tells the watchdog the launcher's session as soon as the launcher exists
    child.kill()
    assert child.wait(60) == -signal.SIGKILL
    # The watchdog kills the launcher's whole session: servers, Gym's Ray, the launcher (15 s: a loaded 2-core box),
    # then deletes the run's private folder.
    assert wait_until_gone(mark, 15) == []
    deadline = time.monotonic() + 10
    while run_dirs_of(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run_dirs_of(port) == []


def test_interpreter_exit_stops_servers(tmp_path: Path) -> None:
    child, port, mark = _run_child_until_servers_exist(tmp_path, "atexit")
    (tmp_path / "exit_now").write_text("")
    assert child.wait(90) == 0
    assert wait_until_gone(mark, 15) == []
    assert (tmp_path / "nemo_gym_modules").read_text() == ""  # the runtime imported nothing of NeMo Gym


LIVE_STACKS: list[SharedStack[OwnedGym]] = []


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, policy: PolicyStub):
    """The module's started stacks, one live at a time (each is a whole Gym: memory on a 2-core box)."""

    @contextlib.contextmanager
    def start():
        tmp = tmp_path_factory.mktemp("gym")
        config = config_for(tmp, free_port(), log_dir=tmp / "logs")
        mark = f"stack-{time.monotonic_ns()}"
        os.environ[MARK] = mark  # inherited by this Gym's processes only: it is removed once they are started
        try:
            runtime = start_gym(config, policy_servers(policy.url, "tiny-qwen3"))
        finally:
            del os.environ[MARK]
        runtime.test_mark = mark
        print(f"\nNeMo Gym start-up: {len(runtime.servers)} servers ready in {runtime.startup_s:.1f}s")
        try:
            yield runtime
        finally:
            runtime.shutdown()

    with SharedStack(start) as holder:
        LIVE_STACKS.append(holder)
        try:
            yield holder
        finally:
            LIVE_STACKS.remove(holder)


@pytest.fixture
def stack(stacks: SharedStack[OwnedGym]) -> OwnedGym:
    """A started stack that tests share: nothing in it is killed."""
    return stacks.shared()


@pytest.fixture
def own_stack(stacks: SharedStack[OwnedGym]) -> OwnedGym:
    """A started stack for this test alone: it may kill servers or shut it down."""
    return stacks.own()


@pytest.fixture
def no_live_stack() -> None:
    """No runtime live in this process: a second one would be refused before the check the test is after."""
    for holder in LIVE_STACKS:
        holder.stop()


def test_started_stack_is_ready_and_healthy(stack: OwnedGym) -> None:
    expected = expected_servers(stack)
    assert {s.name for s in stack.servers} == expected
    report = stack.health(http_timeout_s=5.0)
    assert report.ok and {s.name for s in report.servers} == expected
    stack.check_health(http_timeout_s=5.0)
    pids = set(stack.pids())  # the launcher's session: its servers, Gym's own Ray, the launcher
    assert {s.pid for s in stack.servers} <= pids
    assert {p.pid for p in gym_processes(stack.config.nemo_gym.head_server.port)} <= pids
    # Everything started with this Gym's environment, the watchdog aside (spawned by this process), is in it.
    assert {p.pid for p in gym_tree(stack.test_mark)} - {stack._watchdog.pid} <= pids
    logs = {f.name for f in stack.config.nemo_gym.log_dir.iterdir()}
    assert logs == {f"{n}.log" for n in expected} | {"gym_launcher.log"}


def test_gym_joins_a_lean_ray_the_plugin_started_with_no_dashboard_and_no_idle_workers(stack: OwnedGym) -> None:
    section = stack.config.nemo_gym
    gym_config = HeadClient(section.head_server.host, section.head_server.port, timeout_s=5.0).config()
    _, port = gym_config["ray_head_node_address"].rsplit(":", 1)
    tree = gym_tree(stack.test_mark)
    names = {p.pid: " ".join(p.cmdline()) for p in tree}
    # What the plugin started: lean_ray.py, with Gym's launcher as its child.
    leader = psutil.Process(stack._tree.launcher.pid)
    assert str(LEAN_RAY) in " ".join(leader.cmdline())
    gcs = [p for p in tree if "gcs_server" in names[p.pid]]
    assert len(gcs) == 1 and gcs[0].ppid() == leader.pid  # one Ray, lean_ray.py's
    assert int(port) in {c.laddr.port for c in gcs[0].net_connections() if c.status == psutil.CONN_LISTEN}
    # Ray's defaults, gone: the dashboard's module processes and a prestarted worker per CPU.
    assert not [n for n in names.values() if n.startswith(("ray-dashboard-", "ray::IDLE"))], sorted(names.values())


def test_collect_returns_results_in_input_order(stack: OwnedGym) -> None:
    rows = [
        math_row("What is 2+2?", "4", answer="4", delay=1.2),
        math_row("What is 2+3?", "5", answer="7", delay=0.6),
        workplace_row(),
        math_row("What is 3+3?", "6", answer="6", delay=0.0),
    ]
    # As the manager runs it: awaited on the runtime's loop from a fresh event loop that is closed afterwards (verl's
    # auto_await runs generate_sequences under asyncio.run when no loop is running).
    out = asyncio.run(stack.loop.arun(stack.connection.collect(rows, deadline_s=60, health_check_interval_s=2.0)))
    assert [type(o) for o in out] == [dict] * 4
    assert [o["responses_create_params"]["input"][0]["content"] for o in out] == [
        r["responses_create_params"]["input"][0]["content"] for r in rows
    ]
    assert [out[i]["reward"] for i in (0, 1, 3)] == [1.0, 0.0, 1.0]
    assert out[2]["response"]["output"][-1]["content"][0]["text"] == "The answer is \\boxed{0}."


def test_collect_refuses_any_loop_but_the_runtimes(stack: OwnedGym) -> None:
    # The runtime's HTTP session is bound to its loop: a batch awaited anywhere else would break it.
    with pytest.raises(RuntimeError, match="must run on the loop it was given"):
        asyncio.run(
            stack.connection.collect(
                [math_row("What is 1+1?", "2", answer="2")], deadline_s=5, health_check_interval_s=2.0
            )
        )
    stack.check_health()


def test_collect_turns_an_http_500_into_a_failure_of_that_row_only(stack: OwnedGym) -> None:
    rows = [math_row("What is 1+1?", "2", answer="2"), math_row("Boom", "1", answer="1", marker="FAIL500")]
    out = collect_blocking(stack, rows, deadline_s=60)
    assert out[0]["reward"] == 1.0
    failure = out[1]
    assert isinstance(failure, EpisodeFailure)
    assert failure.cause is FailureCause.SERVER_ERROR and failure.row == 1
    via = " (through 'math_with_judge_environment_server')" if stack.version.startswith("0.7") else ""
    assert f"agent 'math_with_judge_simple_agent' /run{via} returned HTTP 500" in failure.detail


def test_collect_past_its_deadline_aborts_counting_pending_episodes(stack: OwnedGym) -> None:
    rows = [math_row("What is 1+2?", "3", answer="3"), math_row("Slow", "1", answer="1", marker="HANG")]
    t0 = time.monotonic()
    with pytest.raises(RolloutAborted, match=r"deadline of 3s with 1 of 2 episodes pending \(rows 1\)"):
        collect_blocking(stack, rows, deadline_s=3.0)
    assert time.monotonic() - t0 < 30  # the batch deadline ended it, not the loop's backstop 30 s after it
    stack.check_health()


def test_server_death_mid_batch_aborts_naming_it_and_health_then_names_every_dead_server(own_stack: OwnedGym) -> None:
    victim = server_process(own_stack, "workplace_assistant")
    killer = threading.Timer(1.5, victim.kill)
    killer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RolloutAborted, match=r"\['workplace_assistant'\] died with 1 of 1 episodes pending"):
            collect_blocking(own_stack, [workplace_row(marker="HANG")], deadline_s=60, health_check_interval_s=0.5)
    finally:
        killer.join()
    assert time.monotonic() - t0 < 60  # the health check ended it, not the batch deadline
    # A second server killed outside any batch: the health report names both, and check_health raises for both.
    server_process(own_stack, "math_with_judge").kill()
    deadline = time.monotonic() + 30
    while len(own_stack.health().dead) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(own_stack.health().dead) == {"workplace_assistant", "math_with_judge"}
    with pytest.raises(GymServerDied) as err:
        own_stack.check_health()
    assert set(err.value.servers) == {"workplace_assistant", "math_with_judge"}
    assert "NeMo Gym server 'math_with_judge': process" in str(err.value) and "is gone" in str(err.value)


def test_shutdown_leaves_no_process_and_frees_the_head_port(own_stack: OwnedGym) -> None:
    started = own_stack.pids()
    port = own_stack.config.nemo_gym.head_server.port
    assert started and gym_processes(port) and own_stack.run_dir.is_dir()
    t0 = time.monotonic()
    own_stack.shutdown()
    print(f"\nNeMo Gym shutdown: {time.monotonic() - t0:.1f}s for {len(started)} processes")
    own_stack.shutdown()  # idempotent
    assert own_stack.survivors == ()
    assert [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"] == []
    assert gym_processes(port) == [] and gym_tree(own_stack.test_mark) == []
    assert not own_stack.run_dir.exists()  # the job config and Gym's Ray session files went with it
    check_port_free("127.0.0.1", port)
    with pytest.raises(RolloutAborted, match="shut down"):
        rows = [math_row("q", "1", answer="1")]
        asyncio.run(own_stack.connection.collect(rows, deadline_s=5, health_check_interval_s=2.0))


# Gym 0.7's `single_agent_turn_legacy` environment server runs the episode itself and answers a failed one with
# HTTP 200 and Gym's failure fields: declared here in front of our uppercase_share agent (the name of the relay Gym
# would otherwise generate), with the defaults of its shipped config.
EPISODE_SERVER = """
uppercase_share_environment_server:
  environment_servers:
    single_agent_turn_legacy:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: uppercase_share}
      agent_server: {type: responses_api_agents, name: uppercase_share_simple_agent}
      max_concurrent_episodes: null
      queue_timeout_seconds: null
      default_episode_timeout_seconds: 600
      cleanup_timeout_seconds: 60
"""


def test_a_failure_row_of_gyms_environment_server_comes_back_as_that_rows_typed_failure(
    tmp_path: Path, policy: PolicyStub, no_live_stack: None
) -> None:
    repo = REPO_ROOT
    (tmp_path / "episode_server.yaml").write_text(EPISODE_SERVER)
    paths = ("resources_servers/uppercase_share/configs/uppercase_share.yaml", str(tmp_path / "episode_server.yaml"))
    config = gym_config(paths, free_port(), timeouts={"startup_s": 600}, venv_dir=tmp_path / "cache" / "venvs")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)  # our environment's folder resolves against the current directory
        runtime = start_gym(config, policy_servers(policy.url, "tiny-qwen3"))
    try:
        if not runtime.version.startswith("0.7"):
            pytest.fail(f"this test needs Gym 0.7's environment servers, the suite runs Gym {runtime.version}")
        assert runtime.connection.targets["uppercase_share_simple_agent"].via == "uppercase_share_environment_server"
        row = json.loads((repo / "resources_servers/uppercase_share/data/example.jsonl").read_text().splitlines()[0])
        failing = json.loads(json.dumps(row))
        failing["responses_create_params"]["input"][-1]["content"] += " FAIL500"
        out = collect_blocking(runtime, [row, failing], deadline_s=120)
    finally:
        runtime.shutdown()
    assert isinstance(out[0], dict) and 0.0 <= out[0]["reward"] <= 1.0
    assert out[1] == EpisodeFailure(FailureCause.ENVIRONMENT_FAILED, out[1].detail, row=1)
    assert out[1].detail.startswith(
        "'uppercase_share_environment_server' /run reported failure class 'environment_server_failed' ("
    )


def test_a_row_its_environment_masks_comes_back_masked_and_counted_by_cause(
    tmp_path: Path, policy: PolicyStub, no_live_stack: None
) -> None:
    """A real Gym 0.7 resources server's verify sets `mask_sample` (tests/cpu/gym_envs/.../mask_on_request)."""
    paths = ["resources_servers/mask_on_request/configs/mask_on_request.yaml"]
    config = gym_config(paths, free_port(), timeouts={"startup_s": 600}, venv_dir=tmp_path / "cache" / "venvs")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(GYM_ENVS)  # Gym finds the test environment under the current directory
        runtime = start_gym(config, policy_servers(policy.url, "tiny-qwen3"))
    try:
        if not runtime.version.startswith("0.7"):
            pytest.fail(f"this test needs Gym 0.7's mask_sample, the suite runs Gym {runtime.version}")
        rows = [math_row("What is 1+1?", "2", answer="2"), math_row("What is 2+2?", "4", answer="4", marker="MASKME")]
        for row in rows:
            row["agent_ref"]["name"] = "mask_on_request_simple_agent"
        out = collect_blocking(runtime, rows, deadline_s=120)
    finally:
        runtime.shutdown()
    assert isinstance(out[0], dict) and out[0]["reward"] == 1.0
    assert out[1] == EpisodeFailure(
        FailureCause.MASKED_BY_ENVIRONMENT,
        "'mask_on_request_environment_server' /run marked the episode mask_sample (the environment asks not to "
        "train on it)",
        row=1,
    )
    # Packed as the manager packs a batch: the row trains on nothing and is counted under its own cause.
    packer = BatchPacker(2, prompt_length=256, response_length=64, pad_token_id=0)
    packer.add(0, episode_from_result(out[0], max_prompt_length=256), data_source="mask_on_request_simple_agent")
    packer.add(1, out[1], fallback_prompt_ids=[1, 2, 3], data_source="mask_on_request_simple_agent")
    packed = packer.finish()
    metrics = environment_metrics(packed.stats)
    assert metrics["nemo_gym/all/failed"] == 1.0
    assert metrics["nemo_gym/all/failed/masked_by_environment"] == 1.0
    assert packed.data.batch["response_mask"][1].sum().item() == 0
    assert packed.data.batch["response_mask"][0].sum().item() > 0
