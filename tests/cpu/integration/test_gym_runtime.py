# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym's real servers under GymRuntime, out of process: start, readiness, health, ordered rollouts, shutdown.

The servers are those of the Gym environment the plugin runs (`.venv-gym`, Gym 0.7, unless `NEMO_GYM_ENV` names
another: the suite runs this module on 0.4.0 too): `workplace_assistant`, `math_with_judge` with the judge off,
their `simple_agent`s, 0.7's environment servers in front of them, the training `vllm_model`, started by Gym's own
launcher with its own Ray. The one stand-in is the policy: a small HTTP server that answers
`/v1/chat/completions` and `/tokenize` the way verl's vLLM server does (its real engine is too slow for these
tests' many batches), steered per request by markers in the prompt (answer, delay, HTTP 500, hang).

The tests that kill servers or shut the stack down get a stack of their own (`own_stack`), so the tests pass
in any order; in file order they come last and take the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import EpisodeFailure, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.client import RunTarget, instances_from_json, pairing_problems, run_targets
from recipe.nemo_gym.gym.collect import run_examples_in_order, validate_examples
from recipe.nemo_gym.gym.errors import (
    GymConfigError,
    GymServerDied,
    GymStartTimeout,
    HeadPortInUseError,
)
from recipe.nemo_gym.gym.launch import GymRuntime, check_port_free
from recipe.nemo_gym.gym.seams import (
    check_config_paths,
    extra_roots,
    link_server_venvs,
    nemo_gym_install_root,
    resolve_config_path,
    server_dirs,
    write_interpreter_shim,
)
from recipe.nemo_gym.gym.spec import GymServersSpec, ServerInstance, build_global_config_dict
from recipe.nemo_gym.metrics import environment_metrics
from recipe.nemo_gym.packing.batch import BatchPacker
from recipe.nemo_gym.packing.episode import episode_from_result
from recipe.nemo_gym_testing.gym_runtime import collect_blocking, start_runtime
from recipe.nemo_gym_testing.helpers import (
    ChatCompletionStub,
    SharedStack,
    chat_completion,
    free_port,
    nemo_gym_processes,
    processes_with_env,
    workplace_row,
)
from recipe.nemo_gym_testing.helpers import math_row as shared_math_row

WORKPLACE = "resources_servers/workplace_assistant/configs/workplace_assistant.yaml"
MATH = "resources_servers/math_with_judge/configs/math_with_judge.yaml"
SERVER_NAMES = {
    "policy_model",
    "workplace_assistant",
    "workplace_assistant_simple_agent",
    "math_with_judge",
    "math_with_judge_simple_agent",
}
# Gym 0.7 puts a generated `legacy_agent` relay in front of each agent the configs leave without one.
RELAYS = {"workplace_assistant_environment_server", "math_with_judge_environment_server"}


# ------------------------------------------------------------------------------------------------ helpers


def gym_processes(head_port: int) -> list[psutil.Process]:
    """Every live NeMo Gym server process of the configuration with this head port."""
    return nemo_gym_processes(head_port, with_config_path=True)


def math_row(question: str, expected: str, *, answer: str, delay: float = 0.0, marker: str = "") -> dict:
    """A math row whose prompt tells the policy stub what to answer, how long to wait and what else to do."""
    return shared_math_row(question, expected, content=f"{question} ANSWER={answer} DELAY={delay} {marker}".strip())


class PolicyStub(ChatCompletionStub):
    """Answers like vLLM's OpenAI server with token IDs; the prompt's markers choose what it does."""

    def respond(self, body: dict) -> tuple[int, dict]:
        text = " ".join(str(m.get("content")) for m in body["messages"] if m["role"] in ("user", "system"))
        if "FAIL500" in text:
            return 500, {"object": "error", "message": "policy exploded", "code": 500}
        if "HANG" in text:
            self.release.wait(120)
            return 503, {"object": "error", "message": "released"}
        delay = re.search(r"DELAY=([0-9.]+)", text)
        time.sleep(float(delay.group(1)) if delay else 0.0)
        answer = re.search(r"ANSWER=(\S+)", text)
        return 200, chat_completion(body, f"The answer is \\boxed{{{answer.group(1) if answer else '0'}}}.", (9, 8))


def expected_servers(runtime: GymRuntime) -> set[str]:
    return SERVER_NAMES | (RELAYS if runtime.version.startswith("0.7") else set())


def server_process(runtime: GymRuntime, name: str) -> psutil.Process:
    """The Python process of one server (`app.py`), under the process Gym reported for it."""
    wrapper = psutil.Process(next(s.pid for s in runtime.servers if s.name == name))
    return next(p for p in [wrapper, *wrapper.children(recursive=True)] if "app.py" in " ".join(p.cmdline()))


def spec_for(tmp: Path, head_port: int, policy_url: str, **kw) -> GymServersSpec:
    return GymServersSpec(
        config_paths=(WORKPLACE, MATH),
        policy_base_urls=(policy_url,),
        policy_model_name="tiny-qwen3",
        head_server_port=head_port,
        cache_dir=tmp / "cache",
        **kw,
    )


# ---------------------------------------------------------------------------------------- pure functions


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


def test_build_global_config_dict_exact(tmp_path: Path) -> None:
    spec = GymServersSpec(
        config_paths=[MATH],
        policy_base_urls=["http://h1:8000/v1", "http://h2:8000/v1"],
        policy_model_name="/models/qwen",
        policy_api_key="k",
        head_server_port=12345,
        log_dir=tmp_path / "logs",
        overrides={"math_with_judge": {"resources_servers": {"math_with_judge": {"should_use_judge": False}}}},
    )
    assert spec.all_config_paths == ("responses_api_models/vllm_model/configs/vllm_model_for_training.yaml", MATH)
    assert build_global_config_dict(spec, Path("/v"), Path("/u")) == {
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


def test_spec_from_plugin_yaml_maps_every_field(tmp_path: Path) -> None:
    from recipe.nemo_gym.config import load_config

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
  head_server: {{host: 0.0.0.0, port: 12001}}
  policy_api_key: secret
  uses_reasoning_parser: true
  venv_dir: {tmp_path}/venvs
  log_dir: {tmp_path}/logs
timeouts: {{startup_s: 42, shutdown_grace_s: 3}}
"""
    )
    spec = GymServersSpec.from_config(load_config(path), ["http://h:1/v1"], "served-name")
    assert spec.all_config_paths == (
        str(tmp_path / "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"),
        "/abs/env.yaml",
    )
    assert spec.overrides == {
        "policy_model": {
            "responses_api_models": {"vllm_model": {"uses_reasoning_parser": True, "extra_body": {"x": 1}}}
        }
    }
    assert (spec.head_server_host, spec.head_server_port, spec.policy_api_key) == ("0.0.0.0", 12001, "secret")
    assert (spec.policy_base_urls, spec.policy_model_name, spec.environment) == (
        ("http://h:1/v1",),
        "served-name",
        tmp_path / "gym-env",
    )
    assert (spec.venv_dir, spec.log_dir) == (tmp_path / "venvs", tmp_path / "logs")
    assert (spec.startup_timeout_s, spec.shutdown_grace_s) == (42, 3)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"config_paths": ()}, "config_paths is empty"),
        ({"policy_base_urls": ("localhost:8000",)}, "not an http(s) URL"),
        ({"overrides": {"head_server": {"port": 1}}}, "['head_server']"),
        ({"overrides": {"ray_head_node_address": "10.0.0.1:6379"}}, "['ray_head_node_address']"),
        ({"head_server_port": 70000}, "head_server_port: Input should be less than or equal to 65535, got 70000"),
        ({"startup_timeout_s": 0}, "startup_timeout_s: Input should be greater than 0, got 0"),
    ],
)
def test_spec_rejects_bad_fields_naming_them(kwargs: dict, needle: str) -> None:
    base = {"config_paths": (MATH,), "policy_base_urls": ("http://h:1/v1",), "policy_model_name": "m"}
    with pytest.raises(GymConfigError, match=re.escape(needle)):
        GymServersSpec(**(base | kwargs))


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


# ---------------------------------------------------------------------------------- real NeMo Gym servers


@pytest.fixture(scope="module")
def policy():
    stub = PolicyStub()
    yield stub
    stub.close()


def test_start_with_missing_config_path_fails_before_starting_anything(tmp_path: Path) -> None:
    port = free_port()
    spec = GymServersSpec(
        config_paths=(MATH, "resources_servers/no_such_env/configs/no_such_env.yaml"),
        policy_base_urls=("http://127.0.0.1:9/v1",),
        policy_model_name="m",
        head_server_port=port,
        cache_dir=tmp_path,
    )
    with pytest.raises(GymConfigError, match=r"'resources_servers/no_such_env/configs/no_such_env.yaml' \(looked in"):
        start_runtime(spec)
    assert gym_processes(port) == []
    check_port_free("127.0.0.1", port)


@pytest.mark.integration
def test_start_with_head_port_in_use_names_it_and_starts_nothing(tmp_path: Path, no_live_stack: None) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = spec_for(tmp_path, port, "http://127.0.0.1:9/v1")
        with pytest.raises(HeadPortInUseError, match=rf"head server port 127.0.0.1:{port} is already in use"):
            start_runtime(spec)
        assert gym_processes(port) == []
        assert not list((tmp_path / "cache").glob("**/.venv"))


@pytest.mark.integration
def test_start_that_misses_its_deadline_names_servers_and_leaves_no_process(
    tmp_path: Path, no_live_stack: None
) -> None:
    port = free_port()
    spec = spec_for(tmp_path, port, "http://127.0.0.1:9/v1", startup_timeout_s=4.0)
    t0 = time.monotonic()
    with pytest.raises(GymStartTimeout) as err:
        start_runtime(spec)
    assert time.monotonic() - t0 < 4.0 + 60.0  # deadline, then a bounded teardown (loose: a loaded 2-core box)
    assert "not ready within 4s" in str(err.value)
    assert set(err.value.servers) <= SERVER_NAMES | RELAYS | {"head_server"} and err.value.servers
    assert gym_processes(port) == []
    check_port_free("127.0.0.1", port)


CHILD = """
import os, signal, sys, threading, time
from pathlib import Path
from recipe.nemo_gym.gym.spec import GymServersSpec
from recipe.nemo_gym_testing.gym_runtime import start_runtime

port, tmp, mode = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
spec = GymServersSpec(
    config_paths=("resources_servers/math_with_judge/configs/math_with_judge.yaml",),
    policy_base_urls=("http://127.0.0.1:9/v1",), policy_model_name="m",
    head_server_port=port, cache_dir=tmp / "cache", startup_timeout_s=300,
)
if mode == "sigterm":
    def previous(signum, frame):
        (tmp / "previous_handler_ran").write_text(str(signum))
        os._exit(0)  # no atexit, no unwinding: only the runtime's SIGTERM hook can have stopped the servers
    signal.signal(signal.SIGTERM, previous)
    start_runtime(spec)  # servers start; the test sends SIGTERM while they come up
elif mode == "sigkill":
    start_runtime(spec)
    time.sleep(600)  # the test SIGKILLs this process: no handler, no atexit runs
else:
    threading.Thread(target=start_runtime, args=(spec,), daemon=True).start()
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
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, MARK: mark},
    )
    deadline = time.monotonic() + 120
    while len(gym_processes(port)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(gym_processes(port)) >= 3, "the child never launched its servers"
    return child, port, mark


@pytest.mark.integration
def test_sigterm_of_the_trainer_stops_servers_and_chains_the_previous_handler(tmp_path: Path) -> None:
    child, port, mark = _run_child_until_servers_exist(tmp_path, "sigterm")
    child.terminate()
    assert child.wait(60) == 0
    assert (tmp_path / "previous_handler_ran").read_text() == str(int(signal.SIGTERM))
    assert wait_until_gone(mark, 15) == []
    assert run_dirs_of(port) == []


@pytest.mark.integration
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


@pytest.mark.integration
def test_interpreter_exit_stops_servers(tmp_path: Path) -> None:
    child, port, mark = _run_child_until_servers_exist(tmp_path, "atexit")
    (tmp_path / "exit_now").write_text("")
    assert child.wait(90) == 0
    assert wait_until_gone(mark, 15) == []
    assert (tmp_path / "nemo_gym_modules").read_text() == ""  # the runtime imported nothing of NeMo Gym


LIVE_STACKS: list[SharedStack[GymRuntime]] = []


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, policy: PolicyStub):
    """The module's started stacks, one live at a time (each is a whole Gym: memory on a 2-core box)."""

    @contextlib.contextmanager
    def start():
        tmp = tmp_path_factory.mktemp("gym")
        spec = spec_for(tmp, free_port(), policy.url, log_dir=tmp / "logs", startup_timeout_s=300.0)
        mark = f"stack-{time.monotonic_ns()}"
        os.environ[MARK] = mark  # inherited by this Gym's processes only: it is removed once they are started
        try:
            runtime = start_runtime(spec)
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
def stack(stacks: SharedStack[GymRuntime]) -> GymRuntime:
    """A started stack that tests share: nothing in it is killed."""
    return stacks.shared()


@pytest.fixture
def own_stack(stacks: SharedStack[GymRuntime]) -> GymRuntime:
    """A started stack for this test alone: it may kill servers or shut it down."""
    return stacks.own()


@pytest.fixture
def no_live_stack() -> None:
    """No runtime live in this process: a second one would be refused before the check the test is after."""
    for holder in LIVE_STACKS:
        holder.stop()


@pytest.mark.integration
def test_started_stack_is_ready_and_healthy(stack: GymRuntime) -> None:
    expected = expected_servers(stack)
    assert {s.name for s in stack.servers} == expected
    report = stack.health(http_timeout_s=5.0)
    assert report.ok and {s.name for s in report.servers} == expected
    stack.check_health(http_timeout_s=5.0)
    pids = set(stack.pids())  # the launcher's session: its servers, Gym's own Ray, the launcher
    assert {s.pid for s in stack.servers} <= pids
    assert {p.pid for p in gym_processes(stack.spec.head_server_port)} <= pids
    # Everything started with this Gym's environment, the watchdog aside (spawned by this process), is in it.
    assert {p.pid for p in gym_tree(stack.test_mark)} - {stack._watchdog.pid} <= pids
    logs = {f.name for f in stack.spec.log_dir.iterdir()}
    assert logs == {f"{n}.log" for n in expected} | {"gym_launcher.log"}


@pytest.mark.integration
def test_collect_returns_results_in_input_order(stack: GymRuntime) -> None:
    rows = [
        math_row("What is 2+2?", "4", answer="4", delay=1.2),
        math_row("What is 2+3?", "5", answer="7", delay=0.6),
        workplace_row(),
        math_row("What is 3+3?", "6", answer="6", delay=0.0),
    ]
    # As the manager runs it: awaited on the runtime's loop from a fresh event loop that is closed afterwards (verl's
    # auto_await runs generate_sequences under asyncio.run when no loop is running).
    out = asyncio.run(stack.loop.arun(stack.collect(rows, deadline_s=60, health_check_interval_s=2.0)))
    assert [type(o) for o in out] == [dict] * 4
    assert [o["responses_create_params"]["input"][0]["content"] for o in out] == [
        r["responses_create_params"]["input"][0]["content"] for r in rows
    ]
    assert [out[i]["reward"] for i in (0, 1, 3)] == [1.0, 0.0, 1.0]
    assert out[2]["response"]["output"][-1]["content"][0]["text"] == "The answer is \\boxed{0}."


@pytest.mark.integration
def test_collect_refuses_any_loop_but_the_runtimes(stack: GymRuntime) -> None:
    # The runtime's HTTP session is bound to its loop: a batch awaited anywhere else would break it.
    with pytest.raises(RuntimeError, match="must run on the loop it was given"):
        asyncio.run(
            stack.collect([math_row("What is 1+1?", "2", answer="2")], deadline_s=5, health_check_interval_s=2.0)
        )
    stack.check_health()


@pytest.mark.integration
def test_collect_turns_an_http_500_into_a_failure_of_that_row_only(stack: GymRuntime) -> None:
    rows = [math_row("What is 1+1?", "2", answer="2"), math_row("Boom", "1", answer="1", marker="FAIL500")]
    out = collect_blocking(stack, rows, deadline_s=60)
    assert out[0]["reward"] == 1.0
    failure = out[1]
    assert isinstance(failure, EpisodeFailure)
    assert failure.cause is FailureCause.SERVER_ERROR and failure.row == 1
    via = " (through 'math_with_judge_environment_server')" if stack.version.startswith("0.7") else ""
    assert f"agent 'math_with_judge_simple_agent' /run{via} returned HTTP 500" in failure.detail


@pytest.mark.integration
def test_collect_past_its_deadline_aborts_counting_pending_episodes(stack: GymRuntime) -> None:
    rows = [math_row("What is 1+2?", "3", answer="3"), math_row("Slow", "1", answer="1", marker="HANG")]
    t0 = time.monotonic()
    with pytest.raises(RolloutAborted, match=r"deadline of 3s with 1 of 2 episodes pending \(rows 1\)"):
        collect_blocking(stack, rows, deadline_s=3.0)
    assert time.monotonic() - t0 < 30  # the batch deadline ended it, not the loop's backstop 30 s after it
    stack.check_health()


@pytest.mark.integration
def test_server_death_mid_batch_aborts_naming_the_server(own_stack: GymRuntime) -> None:
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


@pytest.mark.integration
def test_health_reports_a_killed_server_by_name(own_stack: GymRuntime) -> None:
    for name in ("workplace_assistant", "math_with_judge"):
        server_process(own_stack, name).kill()
    deadline = time.monotonic() + 30
    while len(own_stack.health().dead) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(own_stack.health().dead) == {"workplace_assistant", "math_with_judge"}
    with pytest.raises(GymServerDied) as err:
        own_stack.check_health()
    assert set(err.value.servers) == {"workplace_assistant", "math_with_judge"}
    assert "NeMo Gym server 'math_with_judge': process" in str(err.value) and "is gone" in str(err.value)


@pytest.mark.integration
def test_shutdown_leaves_no_process_and_frees_the_head_port(own_stack: GymRuntime) -> None:
    started = own_stack.pids()
    port = own_stack.spec.head_server_port
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
        asyncio.run(own_stack.collect([math_row("q", "1", answer="1")], deadline_s=5, health_check_interval_s=2.0))


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


@pytest.mark.integration
def test_a_failure_row_of_gyms_environment_server_comes_back_as_that_rows_typed_failure(
    tmp_path: Path, policy: PolicyStub, no_live_stack: None
) -> None:
    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "episode_server.yaml").write_text(EPISODE_SERVER)
    spec = GymServersSpec(
        config_paths=(
            "resources_servers/uppercase_share/configs/uppercase_share.yaml",
            str(tmp_path / "episode_server.yaml"),
        ),
        policy_base_urls=(policy.url,),
        policy_model_name="tiny-qwen3",
        head_server_port=free_port(),
        cache_dir=tmp_path / "cache",
        startup_timeout_s=300.0,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)  # our environment's folder resolves against the current directory
        runtime = start_runtime(spec)
    try:
        if not runtime.version.startswith("0.7"):
            pytest.fail(f"this test needs Gym 0.7's environment servers, the suite runs Gym {runtime.version}")
        assert runtime.targets["uppercase_share_simple_agent"].via == "uppercase_share_environment_server"
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


@pytest.mark.integration
def test_a_row_its_environment_masks_comes_back_masked_and_counted_by_cause(
    tmp_path: Path, policy: PolicyStub, no_live_stack: None
) -> None:
    """A real Gym 0.7 resources server's verify sets `mask_sample` (tests/cpu/gym_envs/.../mask_on_request)."""
    spec = GymServersSpec(
        config_paths=("resources_servers/mask_on_request/configs/mask_on_request.yaml",),
        policy_base_urls=(policy.url,),
        policy_model_name="tiny-qwen3",
        head_server_port=free_port(),
        cache_dir=tmp_path / "cache",
        startup_timeout_s=300.0,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(Path(__file__).parent / "gym_envs")  # Gym finds the test environment under the current directory
        runtime = start_runtime(spec)
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
