# SPDX-License-Identifier: Apache-2.0
"""OwnedGym's parts that need no server, with exact expectations: config paths and where they are looked for,
what Gym is handed from the validated YAML and NeMo Gym's global config, the head server's instances and run
targets, server folders' venv links, the rows' check, the event loop, the batch core (order, deadline, a dead
server), and a start that fails before anything starts. NeMo Gym's real servers under OwnedGym:
`tests/cpu/integration/test_gym_runtime.py`.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from recipe.nemo_gym.config import NeMoGymConfig, NeMoGymSection, load_config
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import EpisodeFailure, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.errors import GymConfigError, GymServerDied, GymStartTimeout, HeadPortInUseError
from recipe.nemo_gym.gym.over_http.client import (
    RunTarget,
    ServerInstance,
    instances_from_json,
    pairing_problems,
    run_targets,
)
from recipe.nemo_gym.gym.over_http.collect import run_examples_in_order, validate_examples
from recipe.nemo_gym.gym.over_http.limits import ConnectionLimits
from recipe.nemo_gym.gym.owned import launch
from recipe.nemo_gym.gym.owned.job_config import global_config, gym_overrides
from recipe.nemo_gym.gym.owned.launch import (
    RAY_START_ATTEMPTS,
    OwnedGym,
    check_port_free,
    head_server_bind_error,
    launcher_missed_ray_start,
)
from recipe.nemo_gym.gym.owned.liveness import LAUNCHER
from recipe.nemo_gym.gym.owned.seams import (
    check_config_paths,
    default_venv_dir,
    extra_roots,
    link_server_venvs,
    nemo_gym_install_root,
    resolve_config_path,
    server_dirs,
    write_interpreter_shim,
)
from recipe.nemo_gym.gym.types import PolicyServers
from tests.support.gym_runtime import MATH_CONFIG as MATH
from tests.support.gym_runtime import WORKPLACE_CONFIG as WORKPLACE
from tests.support.gym_runtime import gym_config, gym_processes, policy_servers, start_gym
from tests.support.gym_runtime import stub_math_row as math_row
from tests.support.helpers import free_port


def test_resolve_config_path_prefers_cwd_then_install_root(tmp_path: Path) -> None:
    cwd, root = tmp_path / "cwd", tmp_path / "root"
    for base in (cwd, root):
        (base / "a").mkdir(parents=True)
    (root / "a/only_root.yaml").write_text("x: 1")
    (root / "a/both.yaml").write_text("x: 1")
    (cwd / "a/both.yaml").write_text("x: 2")
    assert resolve_config_path("a/only_root.yaml", cwd, root) == root / "a/only_root.yaml"
    assert resolve_config_path("a/both.yaml", cwd, root) == cwd / "a/both.yaml"
    assert resolve_config_path(str(root / "a/both.yaml"), cwd, root) == root / "a/both.yaml"
    assert resolve_config_path("a/missing.yaml", cwd, root) is None


def test_check_config_paths_names_every_missing_path_and_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(GymConfigError) as err:
        check_config_paths([WORKPLACE, "nope/one.yaml", "/abs/two.yaml"], tmp_path, nemo_gym_install_root())
    message = str(err.value)
    assert "'nope/one.yaml'" in message and str(tmp_path / "nope/one.yaml") in message
    assert str(nemo_gym_install_root() / "nope/one.yaml") in message and "'/abs/two.yaml'" in message
    assert "workplace_assistant.yaml" not in message
    assert check_config_paths([WORKPLACE], tmp_path, nemo_gym_install_root()) == [nemo_gym_install_root() / WORKPLACE]


def test_global_config_exact(tmp_path: Path) -> None:
    section = NeMoGymSection(
        config_paths=[MATH], policy_api_key="k", head_server={"port": 12345}, log_dir=tmp_path / "logs"
    )
    policy = PolicyServers(("http://h1:8000/v1", "http://h2:8000/v1"), "/models/qwen")
    overrides = {"math_with_judge": {"resources_servers": {"math_with_judge": {"should_use_judge": False}}}}
    assert global_config(section, policy, overrides, Path("/v"), Path("/u"), tmp_path / "logs") == {
        "model_endpoint_readiness_timeout_seconds": 0,
        "math_with_judge": {"resources_servers": {"math_with_judge": {"should_use_judge": False}}},
        "policy_base_url": ["http://h1:8000/v1", "http://h2:8000/v1"],
        "policy_api_key": "k",
        "policy_model_name": "/models/qwen",
        "head_server": {"host": "127.0.0.1", "port": 12345},
        "skip_venv_if_present": True,
        "uv_venv_dir": "/v",
        "uv_cache_dir": "/u",
        "nemo_gym_log_dir": str(tmp_path / "logs"),
    }


def test_the_plugin_yaml_is_what_gym_is_started_with(tmp_path: Path) -> None:
    """Every key of `nemo_gym` that reaches Gym, read from the validated YAML itself (no second description)."""
    path = tmp_path / "plugin.yaml"
    path.write_text(
        f"""
nemo_gym:
  environment: {tmp_path}/gym-env
  root: {tmp_path}
  config_paths:
    - responses_api_models/vllm_model/configs/vllm_model_for_training.yaml
    - /abs/env.yaml
  config_overrides:
    policy_model: {{responses_api_models: {{vllm_model: {{extra_body: {{x: 1}}}}}}}}
    global_aiohttp_connector_limit: 7
  head_server: {{host: 0.0.0.0, port: 12001}}
  policy_api_key: secret
  uses_reasoning_parser: true
  venv_dir: {tmp_path}/venvs
  log_dir: {tmp_path}/logs
timeouts: {{startup_s: 42, shutdown_grace_s: 3}}
"""
    )
    section = load_config(path).nemo_gym
    assert section.rooted_config_paths() == [
        str(tmp_path / "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"),
        "/abs/env.yaml",
    ]
    limits = ConnectionLimits(total=50, per_host=5, soft=1024, hard=1024, server_soft=1024)
    overrides = gym_overrides(section, limits)
    # The limits go under the user's overrides: the user's total wins, the per-host limit is the derived one.
    assert overrides == {
        "global_aiohttp_connector_limit": 7,
        "global_aiohttp_connector_limit_per_host": 5,
        "policy_model": {
            "responses_api_models": {"vllm_model": {"uses_reasoning_parser": True, "extra_body": {"x": 1}}}
        },
    }
    job = global_config(section, PolicyServers(("http://h:1/v1",), "served-name"), overrides, Path("/v"), Path("/u"),
                        section.log_dir)  # fmt: skip
    assert (job["head_server"], job["policy_api_key"], job["policy_model_name"]) == (
        {"host": "0.0.0.0", "port": 12001},
        "secret",
        "served-name",
    )
    assert (section.environment, section.venv_dir, job["nemo_gym_log_dir"]) == (
        tmp_path / "gym-env",
        tmp_path / "venvs",
        str(tmp_path / "logs"),
    )


@pytest.mark.parametrize(
    ("nemo_gym", "needle"),
    [
        (
            {"config_overrides": {"head_server": {"port": 1}}},
            "nemo_gym.config_overrides: Value error, sets ['head_server']",
        ),
        ({"config_overrides": {"ray_head_node_address": "x:6379"}}, "sets ['ray_head_node_address'], which the plugin"),
        ({"head_server": {"port": 70000}}, "nemo_gym.head_server.port: Input should be less than or equal to 65535"),
    ],
)
def test_the_yaml_refuses_what_gym_could_not_be_started_with_naming_the_key(tmp_path, nemo_gym, needle) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump({"nemo_gym": {"config_paths": [MATH], **nemo_gym}}))
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(path)


@pytest.mark.parametrize(
    ("base_urls", "model", "needle"),
    [
        ((), "m", "no policy server"),
        (("localhost:8000",), "m", "['localhost:8000'] are not http(s) URLs"),
        (("http://h:1/v1",), "", "model name is empty"),
    ],
)
def test_policy_servers_refuse_what_gym_could_not_call(base_urls, model, needle) -> None:
    with pytest.raises(GymConfigError, match=re.escape(needle)):
        PolicyServers(base_urls, model)


def test_instances_from_the_head_server_become_typed_records() -> None:
    listed = [
        {"process_name": "policy_model", "server_type": "responses_api_models", "name": "vllm_model",
         "host": "127.0.0.1", "port": 14364, "pid": 4509, "url": "http://127.0.0.1:14364", "dir_path": "/x"},
        {"process_name": "math_with_judge_simple_agent", "server_type": "responses_api_agents",
         "name": "simple_agent", "host": None, "port": None, "pid": None},
    ]  # fmt: skip
    assert instances_from_json(listed) == [
        ServerInstance("policy_model", "responses_api_models", "vllm_model", "127.0.0.1", 14364, pid=4509),
        ServerInstance("math_with_judge_simple_agent", "responses_api_agents", "simple_agent", None, None),
    ]


def _instance(name: str, server_type: str, port: int) -> ServerInstance:
    return ServerInstance(name, server_type, "x", "h", port)


def test_run_targets_go_through_the_environment_server_in_front_of_an_agent_else_to_the_agent() -> None:
    config = {
        "math_simple_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
        "tools_simple_agent": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
        "math_environment_server": {
            "environment_servers": {
                "legacy_agent": {"agent_server": {"type": "responses_api_agents", "name": "math_simple_agent"}}
            }
        },
        "head_server": {"host": "h", "port": 11000},
    }
    instances = [
        _instance("math_simple_agent", "responses_api_agents", 1),
        _instance("tools_simple_agent", "responses_api_agents", 2),
        _instance("math_environment_server", "environment_servers", 3),
        _instance("policy_model", "responses_api_models", 4),
    ]
    assert run_targets(config, instances) == {
        "math_simple_agent": RunTarget("math_simple_agent", "http://h:3", via="math_environment_server"),
        "tools_simple_agent": RunTarget("tools_simple_agent", "http://h:2"),
    }
    second = {"environment_servers": {"legacy_agent": {"agent_server": {"name": "math_simple_agent"}}}}
    with pytest.raises(ValueError, match=r"'math_simple_agent' is fronted by several environment servers"):
        run_targets(config | {"other_environment_server": second}, instances)


def test_each_gym_interpreter_gets_its_own_venv_links_so_two_stacks_never_share_a_shim(tmp_path: Path) -> None:
    # A Gym 0.4 stack (the trainer's .venv) beside a Gym 0.7 one (.venv-gym) once ran 0.7's servers on 0.4's
    # interpreter through the one shim they shared (`No module named 'nemo_gym.base_environment_server'`).
    old, new = (
        default_venv_dir(tmp_path, "/repo/.venv/bin/python"),
        default_venv_dir(tmp_path, "/repo/.venv-gym/bin/python"),
    )
    assert old != new and old.parent == new.parent == tmp_path / "nemo_gym_venvs"
    assert default_venv_dir(tmp_path, "/repo/.venv/bin/python") == old  # stable: links are made once per interpreter
    shims = [write_interpreter_shim(folder, python) for folder, python in ((old, "/a/python"), (new, "/b/python"))]
    assert [(shim / "bin" / "python").read_text().splitlines()[1] for shim in shims] == [
        'exec "/a/python" "$@"',
        'exec "/b/python" "$@"',
    ]


def test_every_server_folder_of_the_roots_gets_a_venv_link(tmp_path: Path) -> None:
    for folder in ("resources_servers/math", "responses_api_agents/simple_agent", "environment_servers/relay",
                   "resources_servers/__pycache__", "unrelated/thing"):  # fmt: skip
        (tmp_path / "root" / folder).mkdir(parents=True)
    (tmp_path / "cwd/resources_servers/mine").mkdir(parents=True)
    assert server_dirs([tmp_path / "root", tmp_path / "cwd", tmp_path / "missing"]) == [
        ("environment_servers", "relay"),
        ("resources_servers", "math"),
        ("resources_servers", "mine"),
        ("responses_api_agents", "simple_agent"),
    ]


def test_the_folders_of_nemo_gym_extra_roots_are_roots_too() -> None:
    # Gym 0.7 looks for server folders under $NEMO_GYM_EXTRA_ROOTS first; their servers need venv links as well.
    assert extra_roots({"NEMO_GYM_EXTRA_ROOTS": f"/a/b{os.pathsep}{os.pathsep}/c"}) == [Path("/a/b"), Path("/c")]
    assert extra_roots({}) == []


def test_validate_examples_names_every_bad_row_in_one_error() -> None:
    good = math_row("q", "1", answer="1")
    agents = {"math_with_judge_simple_agent"}
    assert validate_examples([good, good], agents) == ["math_with_judge_simple_agent"] * 2
    no_agent = {k: v for k, v in good.items() if k != "agent_ref"}
    no_params = {"agent_ref": {"name": "math_with_judge_simple_agent"}}
    with pytest.raises(ValueError) as err:
        validate_examples([good, no_agent, good | {"agent_ref": {"name": "other"}}, no_params, "text"], agents)
    assert str(err.value) == (
        "4 of 5 rows cannot run on the agents of this NeMo Gym configuration "
        "(configured agents: ['math_with_judge_simple_agent']); nothing was sent: "
        "row 1: missing agent_ref.name (the agent server that runs the episode); "
        "row 2: agent_ref.name 'other' is not configured; row 3: missing responses_create_params; "
        "row 4: expected a mapping, got str"
    )


def test_validate_examples_uses_the_callers_row_labels_and_shows_ten() -> None:
    rows = [{"agent_ref": {"name": f"a{i}"}, "responses_create_params": {}} for i in range(12)]
    labels = [f"batch row {i} (dataset index {100 + i})" for i in range(12)]
    with pytest.raises(ValueError) as err:
        validate_examples(rows, {"a0"}, labels=labels, config="plugin.yaml")
    message = str(err.value)
    assert message.startswith("11 of 12 rows cannot run on the agents of plugin.yaml (configured agents: ['a0'])")
    assert "batch row 1 (dataset index 101): agent_ref.name 'a1' is not configured" in message
    assert "batch row 10 (dataset index 110)" in message and "batch row 11 " not in message
    assert message.endswith("; and 1 more")


def test_interpreter_shim_runs_this_interpreter_and_links_are_idempotent(tmp_path: Path) -> None:
    import subprocess

    shim = write_interpreter_shim(tmp_path, sys.executable)
    links = link_server_venvs(tmp_path, [("resources_servers", "m"), ("responses_api_agents", "a")], shim)
    assert links == [tmp_path / "resources_servers/m/.venv", tmp_path / "responses_api_agents/a/.venv"]
    assert link_server_venvs(tmp_path, [("resources_servers", "m")], shim) == links[:1]
    venv = links[0]
    assert (venv / "bin/python").exists() and (venv / "bin/activate").exists()
    out = subprocess.run(
        ["bash", "-c", f"source {venv}/bin/activate && python -c 'import sys; print(sys.prefix)'"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == sys.prefix
    (tmp_path / "resources_servers/x/.venv").mkdir(parents=True)
    with pytest.raises(GymConfigError, match="is not a link made by this plugin"):
        link_server_venvs(tmp_path, [("resources_servers", "x")], shim)


def test_check_port_free_names_the_busy_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(HeadPortInUseError, match=f"127.0.0.1:{port} is already in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)


# ------------------------------------------------------------------------------------------ event loop


def test_background_loop_runs_from_threads_and_other_loops() -> None:
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.01)
        return a + b

    with BackgroundLoop() as bg:
        assert bg.run(add(1, 2)) == 3
        results = []
        threads = [threading.Thread(target=lambda i=i: results.append(bg.run(add(i, i)))) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [0, 2, 4, 6]
        assert asyncio.run(bg.arun(add(2, 3))) == 5  # from a loop that is then closed, as verl's create() is

        async def loop_identity() -> int:
            return id(asyncio.get_running_loop())

        assert bg.run(loop_identity()) == id(bg.loop)


def test_background_loop_timeout_cancels_the_task_and_says_what_timed_out() -> None:
    cleaned = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    async def raises_timeout() -> None:
        raise TimeoutError("the coroutine's own")

    with BackgroundLoop() as bg:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"my batch did not finish within 0.2s.*cancelled"):
            bg.run(slow(), timeout=0.2, what="my batch")
        assert time.monotonic() - t0 < 5 and cleaned.is_set()
        with pytest.raises(TimeoutError, match="the coroutine's own"):
            bg.run(raises_timeout(), timeout=5)


def test_background_loop_close_cancels_pending_tasks_and_is_idempotent() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    bg = BackgroundLoop()
    future = bg.submit(forever())
    time.sleep(0.05)
    bg.close()
    bg.close()
    assert cancelled.is_set() and future.cancelled()
    assert not bg._thread.is_alive() and bg.loop.is_closed()
    with pytest.raises(RuntimeError, match="is closed"):
        bg.run(asyncio.sleep(0))


# ------------------------------------------------------------------------- ordering, deadline, health core


def test_run_examples_in_order_restores_input_order_and_keeps_failures_per_row() -> None:
    rows = [{"id": i} for i in range(5)]
    completion = []

    async def post_run(i: int, row: dict) -> dict | EpisodeFailure:
        await asyncio.sleep(0.05 * (5 - i))  # finish in reverse order
        completion.append(i)
        if i == 2:
            return EpisodeFailure(FailureCause.SERVER_ERROR, "HTTP 500", row=i)
        return {"echo": row["id"]}

    out = asyncio.run(run_examples_in_order(rows, post_run, deadline_s=10, health_check_interval_s=1.0))
    assert completion == [4, 3, 2, 1, 0]
    assert out == [
        {"echo": 0},
        {"echo": 1},
        EpisodeFailure(FailureCause.SERVER_ERROR, "HTTP 500", row=2),
        {"echo": 3},
        {"echo": 4},
    ]


def test_run_examples_in_order_deadline_cancels_pending_and_counts_them() -> None:
    cancelled = []

    async def post_run(i: int, row: dict) -> dict:
        try:
            await asyncio.sleep(0 if i == 0 else 60)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return {}

    with pytest.raises(RolloutAborted, match=r"deadline of 0.3s with 2 of 3 episodes pending \(rows 1, 2\)"):
        asyncio.run(run_examples_in_order([{}, {}, {}], post_run, deadline_s=0.3, health_check_interval_s=0.1))
    assert sorted(cancelled) == [1, 2]


def test_run_examples_in_order_checks_health_once_per_interval_however_often_rows_finish() -> None:
    # 60 rows ending 10 ms apart wake the wait loop about 60 times in 0.6 s; the health check (an HTTP probe of
    # every policy server and a read of Gym's process table) must still run only once per interval.
    checked: list[float] = []

    async def health() -> None:
        checked.append(asyncio.get_running_loop().time())

    async def post_run(i: int, row: dict) -> dict:
        await asyncio.sleep(0.01 * (i + 1))
        return {"i": i}

    rows = [{} for _ in range(60)]
    out = asyncio.run(
        run_examples_in_order(rows, post_run, deadline_s=30, health_check=health, health_check_interval_s=0.1)
    )
    assert out == [{"i": i} for i in range(60)]
    gaps = [b - a for a, b in zip(checked, checked[1:], strict=False)]
    assert len(checked) >= 3, checked  # before the first request, then while rows are pending
    assert min(gaps) >= 0.1 - 1e-6, gaps  # (the tolerance: float subtraction of the loop's clock)

    checked.clear()
    asyncio.run(run_examples_in_order(rows, post_run, deadline_s=30, health_check=health, health_check_interval_s=10))
    assert len(checked) == 1  # the batch ends before its first interval does


def test_run_examples_in_order_aborts_naming_the_dead_server() -> None:
    calls = []

    def health() -> None:
        calls.append(1)
        if len(calls) >= 3:
            raise GymServerDied("NeMo Gym server 'math_with_judge': process killed by signal 9.", ["math_with_judge"])

    async def post_run(i: int, row: dict) -> dict:
        await asyncio.sleep(60)
        return {}

    with pytest.raises(RolloutAborted, match=r"\['math_with_judge'\] died with 2 of 2 episodes pending"):
        asyncio.run(
            run_examples_in_order([{}, {}], post_run, deadline_s=30, health_check=health, health_check_interval_s=0.05)
        )


# ---------------------------------------------------------------------------------------- starts and pairs


def test_start_with_missing_config_path_fails_before_starting_anything(tmp_path: Path) -> None:
    port = free_port()
    config = gym_config((MATH, "resources_servers/no_such_env/configs/no_such_env.yaml"), port, venv_dir=tmp_path)
    with pytest.raises(GymConfigError, match=r"'resources_servers/no_such_env/configs/no_such_env.yaml' \(looked in"):
        start_gym(config, policy_servers("http://127.0.0.1:9/v1"))
    assert gym_processes(port) == []
    check_port_free("127.0.0.1", port)


def test_an_agent_its_resources_server_does_not_accept_is_named_and_gyms_waiver_lifts_the_check() -> None:
    config = {
        "calc": {"resources_servers": {"calc": {"allowed_agents": ["simple_agent"]}}},
        "judge": {"resources_servers": {"judge": {"allowed_agents": "react_agent"}}},
        "free": {"resources_servers": {"free": {}}},
        "calc_simple_agent": {"responses_api_agents": {"simple_agent": {"resources_server": {"name": "calc"}}}},
        "judge_simple_agent": {"responses_api_agents": {"simple_agent": {"resources_server": {"name": "judge"}}}},
        "free_react_agent": {"responses_api_agents": {"react_agent": {"resources_server": {"name": "free"}}}},
    }
    assert pairing_problems(config) == [
        "agent 'judge_simple_agent' runs 'simple_agent', but its resources server 'judge' accepts only: react_agent"
    ]
    assert pairing_problems(config | {"allow_unsupported_pairing": True}) == []


# The launcher's log tail as the plugin quotes it when Gym's own Ray missed Ray's start-up deadline (seen in a
# suite run on 2 busy cores: NeMo Gym 0.7.0, Ray 2.60).
RAY_MISSED = (
    "NeMo Gym's launcher ended during start-up: it exited with code 1.\n--- last lines of gym_launcher.log ---\n"
    "    ray.init(**ray_init_kwargs)\nException: The current node timed out during startup. This could happen "
    "because some of the raylet failed to startup or the GCS has become overloaded."
)


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (GymServerDied(RAY_MISSED, [LAUNCHER]), True),
        (GymServerDied("NeMo Gym's launcher ended during start-up: it exited with code 1.", [LAUNCHER]), False),
        (GymServerDied(RAY_MISSED, ["math_with_judge"]), False),  # a server of its own, not Gym's Ray
        (GymStartTimeout(RAY_MISSED, ["head_server"]), False),
    ],
)
def test_only_a_launcher_ended_by_rays_start_up_deadline_counts_as_a_missed_ray_start(error, retried) -> None:
    assert launcher_missed_ray_start(error) is retried


# Gym 0.7.0's launcher log when its head server could not listen (uvicorn logs asyncio's bind error; Python 3.13).
HEAD_BIND_FAILED = (
    "INFO:     Waiting for application startup.\n"
    "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 26109): address already in use\n"
    "(policy_model) INFO:     Uvicorn running on http://127.0.0.1:19553 (Press CTRL+C to quit)\n"
)


@pytest.mark.parametrize(
    ("log", "port", "error"),
    [
        (
            HEAD_BIND_FAILED,
            26109,
            "[Errno 98] error while attempting to bind on address ('127.0.0.1', 26109): address already in use",
        ),  # fmt: skip
        (HEAD_BIND_FAILED, 11000, None),  # another listener's port: a server of Gym's, not the head
        ("INFO:     Uvicorn running on http://127.0.0.1:26109 (Press CTRL+C to quit)\n", 26109, None),
        ("", 26109, None),
    ],
)
def test_the_head_servers_bind_error_is_found_in_the_launchers_log_by_its_port(log, port, error) -> None:
    assert head_server_bind_error(log, port) == error


def _retry_config() -> NeMoGymConfig:
    return gym_config([MATH], 11000, timeouts={"startup_s": 60})


def _start_attempts(monkeypatch, outcomes: list) -> list[float]:
    """Replace one start attempt (`OwnedGym._start_once`) by `outcomes` in turn, with no pause between attempts; the
    deadlines it was given."""
    deadlines = []

    def start_once(cls, config, policy, loop, overrides, deadline):
        deadlines.append(deadline)
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(OwnedGym, "_start_once", classmethod(start_once))
    monkeypatch.setattr(launch, "_RAY_RETRY_PAUSE_S", 0.0)
    return deadlines


def test_a_launcher_ended_by_rays_start_up_deadline_is_started_again_within_the_same_deadline(
    monkeypatch, plugin_caplog
) -> None:
    started = object()
    missed = [GymServerDied(RAY_MISSED, [LAUNCHER]) for _ in range(RAY_START_ATTEMPTS - 1)]
    deadlines = _start_attempts(monkeypatch, [*missed, started])
    t0 = time.monotonic()
    assert OwnedGym.start(_retry_config(), policy_servers("http://127.0.0.1:1/v1"), loop=None) is started
    assert len(deadlines) == RAY_START_ATTEMPTS == 3 and len(set(deadlines)) == 1
    assert t0 + 59 < deadlines[0] <= time.monotonic() + 60
    assert f"starting NeMo Gym again (start 3 of at most {RAY_START_ATTEMPTS})" in plugin_caplog.text


@pytest.mark.parametrize(
    ("outcomes", "attempts"),
    [
        ([GymServerDied(RAY_MISSED, [LAUNCHER])] * 3, 3),  # the last start's failure is the caller's
        ([GymServerDied("NeMo Gym server(s) ['math_with_judge'] died during start-up.", ["math_with_judge"])], 1),
        ([GymServerDied(RAY_MISSED, [LAUNCHER]), GymServerDied("server(s) ['math_with_judge'] died", ["x"])], 2),
    ],
)
def test_any_other_start_up_failure_or_the_last_missed_ray_start_is_raised(monkeypatch, outcomes, attempts) -> None:
    deadlines = _start_attempts(monkeypatch, list(outcomes))
    with pytest.raises(GymServerDied) as raised:
        OwnedGym.start(_retry_config(), policy_servers("http://127.0.0.1:1/v1"), loop=None)
    assert len(deadlines) == attempts and raised.value is outcomes[-1]


def test_no_start_is_made_again_without_the_time_for_one_left(monkeypatch) -> None:
    deadlines = _start_attempts(monkeypatch, [GymServerDied(RAY_MISSED, [LAUNCHER]), object()])
    monkeypatch.setattr(launch, "_RAY_RETRY_PAUSE_S", 40.0)  # more than half of the 60 s start-up deadline
    with pytest.raises(GymServerDied):
        OwnedGym.start(_retry_config(), policy_servers("http://127.0.0.1:1/v1"), loop=None)
    assert len(deadlines) == 1


def test_the_test_supports_gym_keeps_its_loop_open_through_a_start_made_once_more(monkeypatch, tmp_path) -> None:
    """`start_gym` (tests/support/gym_runtime.py) makes the loop its Gym closes at shutdown. A first attempt that
    fails on Ray's start-up deadline is shut down before `OwnedGym.start` tries again on the same loop: that
    shutdown must leave the loop open: a closed one would fail every batch of the Gym that did start."""
    attempts = []

    def start(self, deadline):  # one launcher run: the first ends as Ray's missed deadline does
        attempts.append(self)
        if len(attempts) == 1:
            raise GymServerDied(RAY_MISSED, [LAUNCHER])

    monkeypatch.setattr(OwnedGym, "_start", start)
    config = gym_config([MATH], free_port(), timeouts={"startup_s": 60}, venv_dir=tmp_path / "venvs")
    gym = start_gym(config, policy_servers("http://127.0.0.1:1/v1"))
    assert len(attempts) == 2 and attempts[1] is gym
    assert gym.loop.run(asyncio.sleep(0, result="open"), timeout=5, what="a no-op") == "open"
    gym.shutdown()
    with pytest.raises(RuntimeError, match="is closed"):
        gym.loop.run(asyncio.sleep(0), timeout=5, what="a no-op")
