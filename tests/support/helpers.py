# SPDX-License-Identifier: Apache-2.0
"""Plain helpers shared by the test modules under tests/cpu (their pytest fixtures are in tests/cpu/conftest.py).

- `REPO_ROOT`, `TESTS_CPU`, `GYM_ENVS`: the repository, the CPU suite's folder (its tiers are the folders `unit/`,
  `integration/` and `e2e/` in it) and the suite's own NeMo Gym servers (`tests/cpu/gym_envs`), so that no test
  module counts its folder's parents.
- `free_port`: a TCP port free on 127.0.0.1 now.
- `PortForward`: a second address (127.0.0.1) for one TCP server.
- `nemo_gym_processes`, `processes_with_env`, `alive`: process-list scans for what a test may have left running
  (found by psutil, not by the word of the code under test). They look only at processes marked as the test's
  own (a head port, an environment entry its run passed down), so tests running beside it cannot confuse them.
- `ChatCompletionStub`: vLLM's OpenAI chat server as NeMo Gym's training model server calls it, in a thread;
  a subclass says what `/chat/completions` answers (`chat_completion` builds the body).
- `SharedStack`: a started stack (or server) that a module's tests share, and a fresh one for a test that damages
  it, so the tests pass in any order.
- `math_row`, `workplace_row`: NeMo Gym rows for the wheel's `math_with_judge` and `workplace_assistant`.
- `write_job`, `run_script`, `dry_run_overrides`: the submit scripts in DRY_RUN mode with a job file.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from recipe.nemo_gym.ports import pick_free_port

MATH_AGENT = "math_with_judge_simple_agent"
WORKPLACE_AGENT = "workplace_assistant_simple_agent"
VENV_BIN = Path(sys.executable).parent
REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS_CPU = REPO_ROOT / "tests" / "cpu"
GYM_ENVS = TESTS_CPU / "gym_envs"

# ------------------------------------------------------------------------------------------ ports, processes


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, outside the kernel's ephemeral range (`recipe.nemo_gym.ports`): a server
    started on it seconds later does not find it held by some process's outgoing connection."""
    return pick_free_port()


class PortForward:
    """A second address for one TCP server: a listener on 127.0.0.1 that pipes each connection to `target`
    ("host:port"), byte for byte, in threads. A test that needs several servers' addresses (a relay spreading
    calls) can then list one real server twice. A context manager; `address` is "127.0.0.1:port"."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()

    def __enter__(self) -> PortForward:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed by __exit__
                return
            try:
                upstream = socket.create_connection(self._target, timeout=30)
            except OSError:  # the server is gone: the caller sees a closed connection, as it would from the server
                client.close()
                continue
            upstream.settimeout(None)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with contextlib.suppress(OSError):  # the other direction may still be sending: close ours only
            sink.shutdown(socket.SHUT_WR)


def _live_processes_whose_env(
    matches: Callable[[dict[str, str]], bool], exclude: Iterable[int] = ()
) -> list[psutil.Process]:
    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in skip:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
        except psutil.Error:
            continue
        if matches(env):
            found.append(proc)
    return found


def nemo_gym_processes(head_port: int, *, with_config_path: bool = False) -> list[psutil.Process]:
    """Every live (not zombie) process on this machine whose environment holds the NeMo Gym configuration with
    this head port: NeMo Gym puts its whole config, head server included, in each server's NEMO_GYM_CONFIG_DICT.
    With `with_config_path`, only those that also have NEMO_GYM_CONFIG_PATH set."""
    marker = re.compile(rf"\bport: {head_port}\b")

    def matches(env: dict[str, str]) -> bool:
        if with_config_path and "NEMO_GYM_CONFIG_PATH" not in env:
            return False
        return bool(marker.search(env.get("NEMO_GYM_CONFIG_DICT", "")))

    return _live_processes_whose_env(matches)


def processes_with_env(key: str, value: str, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Every live process (this one and `exclude` aside) whose environment has `key=value`: a marker a test put
    in the environment of what it started, which every descendant inherits (Ray's raylet passes its environment
    to the workers it spawns, NeMo Gym to its servers, Slurm to a job's steps)."""
    return _live_processes_whose_env(lambda env: env.get(key) == value, exclude)


def processes_left_with_env(key: str, value: str, *, grace_s: float = 30.0) -> list[str]:
    """The processes with `key=value` in their environment still alive after up to `grace_s` (Ray's and NeMo Gym's
    take a moment to be reaped once their job ends), each as "pid command line"; [] when none is."""
    deadline = time.monotonic() + grace_s
    while (left := processes_with_env(key, value)) and time.monotonic() < deadline:
        time.sleep(1.0)
    described = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
    return described


def kill_processes_with_env(key: str, value: str, cmdline_contains: str) -> list[int]:
    """SIGKILL every live process with `key=value` in its environment whose command line contains
    `cmdline_contains` (a test's fault: one server of the job it started); the pids signalled."""
    killed = []
    for proc in processes_with_env(key, value):
        try:
            if cmdline_contains in " ".join(proc.cmdline()):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return killed


def alive(pids: Iterable[int]) -> list[int]:
    """The pids of `pids` that are live processes (zombies count as gone)."""
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            continue
    return left


def release_cached_memory() -> None:
    """Drop vLLM's and transformers' memoized objects (their `lru_cache`s: tokenizers, configs, chat renderers,
    which they build again when asked) and return the memory freed to the operating system (glibc's `malloc_trim`).
    A pytest worker stays up for the whole run; what one module memoized would otherwise stay beside the next
    modules and the other worker's trainers."""
    import ctypes
    import functools
    import gc

    for cached in gc.get_objects():
        if isinstance(cached, functools._lru_cache_wrapper):  # noqa: SLF001 - the type of every lru_cache
            module = getattr(getattr(cached, "__wrapped__", None), "__module__", None) or ""
            if module.startswith(("vllm", "transformers")):
                cached.cache_clear()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# ------------------------------------------------------------------------------------- chat completion stub


def chat_completion(body: dict, content: str, token_ids: Iterable[int]) -> dict:
    """A vLLM chat completion answering `body` with `content`, its tokens given as `token_id:<n>` log-prob entries
    (as NeMo Gym asks with `return_tokens_as_token_ids`)."""
    logprobs = [{"token": f"token_id:{i}", "logprob": -0.5, "bytes": None, "top_logprobs": []} for i in token_ids]
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "stub"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": []},
                "finish_reason": "stop",
                "logprobs": {"content": logprobs},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


class ChatCompletionStub:
    """vLLM's OpenAI chat server as NeMo Gym's training model server calls it, on 127.0.0.1 in a thread.

    `GET /models` lists `model_name` (what the manager asks each policy server at start); `/tokenize` answers a fixed
    three-token prompt; `/chat/completions` answers what `respond(body)` returns as `(HTTP status, JSON payload)`.
    `release` is set by `close()`, for a `respond` that holds a request. `address` is its "host:port", as verl's
    load balancer lists a policy server; `url` its OpenAI base URL.
    """

    def __init__(self, model_name: str = "tiny-qwen3") -> None:
        self.release = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    return self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
                self._send(404, {"object": "error", "message": f"no GET {self.path}"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/tokenize"):
                    return self._send(200, {"tokens": [1, 2, 3], "count": 3, "max_model_len": 4096})
                self._send(*stub.respond(body))

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the caller may have given up on a held request
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.address}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def respond(self, body: dict) -> tuple[int, dict]:
        raise NotImplementedError

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------------ shared stacks


class SharedStack[T]:
    """A module's started stack (or server), one live at a time, started on first use by `start()`, a context
    manager yielding it.

    Tests that only use it share one (`shared()`). A test that damages it (kills a server, shuts it down) takes
    one that no test uses after it (`own()`): the live one if no test has damaged it, else a new one. So the
    tests pass in any order, and in file order (damaging tests last) nothing starts twice. `cache` holds what
    tests derive from the live one (cleared on each start). `stop()`, or leaving `with SharedStack(...)`, ends the
    live one (the module fixture's teardown).
    """

    def __init__(self, start: Callable[[], AbstractContextManager[T]]) -> None:
        self._start = start
        self._exit: ExitStack | None = None
        self.current: T | None = None
        self.spent = False
        self.cache: dict[str, Any] = {}

    def shared(self) -> T:
        if self._exit is None or self.spent:
            self._restart()
        return self.current

    def own(self) -> T:
        current = self.shared()
        self.spent = True
        return current

    def __enter__(self) -> SharedStack[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        exit_stack, self._exit, self.current, self.spent = self._exit, None, None, False
        self.cache.clear()
        if exit_stack is not None:
            exit_stack.close()

    def _restart(self) -> None:
        self.stop()
        with ExitStack() as exit_stack:
            self.current = exit_stack.enter_context(self._start())
            self._exit = exit_stack.pop_all()


# ------------------------------------------------------------------------------------------------- rows


def math_row(question: str, expected: str = "4", *, content: str | None = None) -> dict[str, Any]:
    """A `math_with_judge` row asking `question` (the user message is `content` when given), `agent_ref` as
    NeMo Gym's data preparation writes it."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": question if content is None else content}]},
        "question": question,
        "expected_answer": expected,
        "agent_ref": {"type": "responses_api_agents", "name": MATH_AGENT},
    }


def workplace_row(marker: str = "") -> dict[str, Any]:
    """NeMo Gym's first `workplace_assistant` example row, `marker` appended to its last message."""
    from recipe.nemo_gym_demo.data import example_rows

    row = example_rows([WORKPLACE_AGENT])[0]
    if marker:
        row["responses_create_params"]["input"][-1]["content"] += f" {marker}"
    return row


# ---------------------------------------------------------------------------------------- source scan


@dataclass(frozen=True)
class DefinedClass:
    name: str
    bases: tuple[str, ...]
    """Each base as written, without its module (`errors.ConfigError` -> `ConfigError`)."""
    where: str
    """`path:line`, the path relative to the repository."""


BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)


def defined_classes(roots: Iterable[Path]) -> list[DefinedClass]:
    """Every class defined in the Python files under `roots`, nested ones too, read with `ast` (nothing imported)."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = tuple(ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases)
                    found.append(DefinedClass(node.name, bases, f"{path.relative_to(REPO_ROOT)}:{node.lineno}"))
    return found


def exception_classes(roots: Iterable[Path]) -> dict[str, tuple[str, frozenset[str]]]:
    """Every class under `roots` that derives, through classes defined there, from a built-in exception: name ->
    (`path:line`, the names of all its ancestors)."""
    classes = defined_classes(roots)
    bases: dict[str, set[str]] = {}
    for c in classes:
        bases.setdefault(c.name, set()).update(c.bases)

    def ancestors(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found = set(bases.get(name, ()))
        for base in bases.get(name, ()):
            if base not in seen:
                found |= ancestors(base, seen | {name})
        return found

    where = {}
    for c in classes:
        where.setdefault(c.name, c.where)
    return {name: (where[name], frozenset(up)) for name in bases if (up := ancestors(name)) & BUILTIN_EXCEPTIONS}


# ------------------------------------------------------------------------------ submit scripts, DRY_RUN


def set_keys(mapping: dict[str, Any], **keys: Any) -> dict[str, Any]:
    """Set nested keys of a job mapping in place, `__` between levels: `training__lr=3e-6` sets training.lr."""
    for dotted, value in keys.items():
        *sections, key = dotted.split("__")
        where = mapping
        for section in sections:
            where = where.setdefault(section, {})
        where[key] = value
    return mapping


def write_job(tmp_path: Path, name: str = "math", **keys: Any) -> Path:
    """`jobs/<name>.yaml` as a user would fill it in, with data files that exist (empty) under `tmp_path`, two
    nodes, and `keys` set (`training__strategy="megatron"` sets training.strategy). Written to
    `tmp_path/<name>.yaml`, so the experiment keeps the job's name."""
    import yaml

    data = tmp_path / "data dir"
    data.mkdir(exist_ok=True)
    for file in ("math_train.jsonl", "math_val.jsonl", "blend_a.jsonl", "blend_b.jsonl", "blend_val.jsonl"):
        (data / file).touch()
    job = yaml.safe_load((REPO_ROOT / "jobs" / f"{name}.yaml").read_text())
    job["environments"] = str(REPO_ROOT / "recipe" / "nemo_gym" / "configs" / f"{name}.yaml")
    job["model"] = str(tmp_path / "models" / "Qwen3 4B")
    job["checkpoint_dir"] = str(tmp_path / "ckpt")
    if name == "math":
        job["data"].update(train_files=[str(data / "math_train.jsonl")], val_files=[str(data / "math_val.jsonl")])
    else:
        job["data"].update(
            train_files=[str(data / "blend_a.jsonl"), str(data / "blend_b.jsonl")],
            val_files=[str(data / "blend_val.jsonl")],
        )
    job.setdefault("cluster", {})["nnodes"] = 2
    set_keys(job, **keys)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def run_script(script: Path, job: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`bash script args...` in DRY_RUN mode with JOB=job, this Python, a wandb key in the environment, outside any
    Slurm job and pin override."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NG_PIN_", "JOB__"))}
    full_env.update(
        {
            "JOB": str(job),
            "DRY_RUN": "1",
            "PYTHON": str(VENV_BIN / "python"),
            "WANDB_API_KEY": "secret-key-never-printed",
            **env,
        }
    )
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=full_env, timeout=120, check=False
    )


def dry_run_overrides(script: Path, config: Path, *args: str, **env: str) -> list[str]:
    """The overrides a submit script's DRY_RUN prints after `<python> -m verl.trainer.main_ppo`."""
    result = run_script(script, config, *args, **env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [env.get("PYTHON", str(VENV_BIN / "python")), "-m", "verl.trainer.main_ppo"]
    return lines[3:]
