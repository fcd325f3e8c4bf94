# SPDX-License-Identifier: Apache-2.0
"""The CPU policy server process, and `CPUPolicyServer`, the parent-side handle that starts and stops it.

Process: `python -m tests.support.cpu_policy.server --model-dir DIR [--port N] [--script FILE.json]
[--served-model-name NAME] [--splice-patch | --no-splice-patch] [-- extra vLLM serve arguments]`.
It parses vLLM's own serve arguments (`--enable-auto-tool-choice --tool-call-parser hermes` by default, then
the extras), makes vLLM's platform the CPU platform, optionally installs the token-exact splice patch
(`recipe.nemo_gym.server_patch.install()`, imported only when on), builds `engine.CPUEngineClient`, and runs
vLLM's `setup_server` and `build_and_serve` (its `build_app`, `init_app_state` with
`supported_tasks=("generate",)` and uvicorn launcher) on 127.0.0.1. `--port 0` (the default) binds a free
port in the child itself, so two servers started at once can never share one; the port is written to
`--port-file` once bound. A missing model directory fails before vLLM is imported.

Handle: `CPUPolicyServer(model_dir, script=None, ...)` writes the script to a file, starts the process in its
own process group with output to a log file, and waits for `/health` under a deadline. If the child dies or
the deadline passes, the whole group is killed and `CPUPolicyServerError` carries the child's log tail.
`stop()` sends SIGTERM to the group, SIGKILL after `grace_s`, and returns only when no process of the group
is left (`recipe/nemo_gym/process_group.py`, which reads /proc). The handle imports no vLLM, torch or transformers.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from recipe.nemo_gym.process_group import stop_group
from tests.support.cpu_policy.script import ScriptedPolicy

DEFAULT_HOST = "127.0.0.1"
DEFAULT_VLLM_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


class CPUPolicyServerError(RuntimeError):
    """The server process failed to start, died, or could not be stopped."""


# -- the server process -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options, and the extra vLLM arguments after `--`."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="python -m tests.support.cpu_policy.server", description=__doc__)
    parser.add_argument("--model-dir", required=True, help="local model directory (config, weights, tokenizer)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=0, help="0: bind a free port (see --port-file)")
    parser.add_argument("--port-file", default=None, help="file the bound port is written to")
    parser.add_argument("--script", default=None, help="ScriptedPolicy JSON file; without it the model generates")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--splice-patch", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads for the model")
    parser.add_argument(
        "--score-script-with-model",
        action="store_true",
        help="report the model's own log-probs (current weights) for scripted tokens, as a trainer recomputes them",
    )
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="exit when the process that started this one is gone"
    )
    return parser.parse_args(argv), extra


def vllm_argv(ours: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    argv = ["--model", str(ours.model_dir), "--host", ours.host, "--port", str(ours.port), *DEFAULT_VLLM_ARGS]
    if ours.served_model_name:
        argv += ["--served-model-name", ours.served_model_name]
    return [*argv, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    ours, extra = parse_args(sys.argv[1:] if argv is None else argv)
    model_dir = Path(ours.model_dir)
    if not (model_dir / "config.json").is_file():
        print(f"cpu policy server: model directory {model_dir} has no config.json", file=sys.stderr)
        return 2
    script = ScriptedPolicy.from_file(ours.script) if ours.script else None
    if ours.exit_with_parent:
        _exit_when_orphaned(os.getppid())

    import torch

    torch.set_num_threads(max(1, ours.torch_threads))

    from tests.support.cpu_policy.cpu_platform import use_cpu_platform

    use_cpu_platform()

    import uvloop
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(vllm_argv(ours, extra))
    validate_parsed_serve_args(args)
    if ours.splice_patch:
        # Imported here, not at the top: the patch is optional for this process and lives in another module.
        from recipe.nemo_gym.server_patch import install

        install()
    uvloop.run(_serve(args, script, ours.port_file, score_scripted=ours.score_script_with_model))
    return 0


def _exit_when_orphaned(parent: int, interval_s: float = 1.0) -> None:
    """Stop this server (SIGTERM to itself) once `parent` is gone: a parent killed with SIGKILL (a Ray actor torn
    down by Ray) cannot stop its children, and a leftover server would hold its port and memory."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10.0)
        os._exit(1)  # the graceful stop did not finish

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


async def _serve(
    args: argparse.Namespace, script: ScriptedPolicy | None, port_file: str | None, *, score_scripted: bool = False
) -> None:
    from vllm.entrypoints.openai.api_server import build_and_serve, setup_server

    from tests.support.cpu_policy.engine import build_engine_client

    listen_address, sock = setup_server(args)  # vLLM's: validates the parsers, binds the socket
    port = sock.getsockname()[1]
    args.port = port
    listen_address = listen_address.rsplit(":", 1)[0] + f":{port}"
    if port_file:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(port_file)
    engine = build_engine_client(args, script, score_scripted=score_scripted)
    try:
        shutdown_task = await build_and_serve(engine, listen_address, sock, args)
        await shutdown_task
    finally:
        sock.close()
        engine.shutdown()


# -- the parent-side handle ---------------------------------------------------------------------------------


def _tail(path: Path, limit: int = 6000) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"
    return data[-limit:].decode("utf-8", errors="replace")


class CPUPolicyServer:
    """Handle on one CPU policy server process; a context manager."""

    def __init__(
        self,
        model_dir: str | Path,
        script: ScriptedPolicy | None = None,
        port: int | None = None,
        served_model_name: str | None = None,
        splice_patch: bool = True,
        extra_args: Sequence[str] = (),
        *,
        score_script_with_model: bool = False,
        exit_with_parent: bool = False,
        startup_timeout_s: float = 300.0,
        grace_s: float = 10.0,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ):
        self.model_dir = Path(model_dir)
        self.script = script
        self.requested_port = port
        self.model_name = served_model_name or str(self.model_dir)
        self.splice_patch = splice_patch
        self.score_script_with_model = score_script_with_model
        self.exit_with_parent = exit_with_parent
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.python = python
        self.env = env
        self.host = DEFAULT_HOST
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.log_path: Path | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise CPUPolicyServerError("the CPU policy server is not running")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")]

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self, port_file: Path, script_file: Path | None) -> list[str]:
        cmd = [self.python, "-m", "tests.support.cpu_policy.server", "--model-dir", str(self.model_dir)]
        cmd += ["--port", str(self.requested_port or 0), "--port-file", str(port_file)]
        if script_file is not None:
            cmd += ["--script", str(script_file)]
        if self.model_name != str(self.model_dir):
            cmd += ["--served-model-name", self.model_name]
        cmd.append("--splice-patch" if self.splice_patch else "--no-splice-patch")
        if self.score_script_with_model:
            cmd.append("--score-script-with-model")
        if self.exit_with_parent:
            cmd.append("--exit-with-parent")
        if self.extra_args:
            cmd += ["--", *self.extra_args]
        return cmd

    def start(self) -> CPUPolicyServer:
        if self.proc is not None:
            raise CPUPolicyServerError("the CPU policy server was already started")
        self._workdir = tempfile.TemporaryDirectory(prefix="cpu-policy-")
        work = Path(self._workdir.name)
        script_file = self.script.to_file(work / "script.json") if self.script is not None else None
        port_file = work / "port"
        self.log_path = work / "server.log"
        env = dict(os.environ if self.env is None else self.env)
        # The child imports this package by module name, from the repository root.
        repo_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(port_file, script_file),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=repo_root,
                start_new_session=True,  # its own process group (and session): stop() kills all of it
            )
        try:
            self._wait_ready(port_file, started + self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _wait_ready(self, port_file: Path, deadline: float) -> None:
        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                raise CPUPolicyServerError(
                    f"CPU policy server (pid {self.proc.pid}) exited with code {code} during start-up; "
                    f"log tail:\n{_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise CPUPolicyServerError(
                    f"CPU policy server (pid {self.proc.pid}) not healthy after {self.startup_timeout_s:.0f} s; "
                    f"log tail:\n{_tail(self.log_path)}"
                )
            if self.port is None and port_file.exists():
                self.port = int(port_file.read_text())
            if self.port is not None and self._healthy():
                return
            time.sleep(0.25)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.root_url}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Terminate the whole process group; returns once none of it is left."""
        proc, self.proc = self.proc, None
        if proc is not None:
            pgid = proc.pid
            survivors = stop_group(pgid, self.grace_s, first=signal.SIGTERM, kill_wait_s=self.grace_s)
            try:
                proc.wait(timeout=self.grace_s)  # reap the leader, our child
            except subprocess.TimeoutExpired as exc:
                raise CPUPolicyServerError(f"CPU policy server (pid {pgid}) survived SIGKILL") from exc
            if survivors:
                raise CPUPolicyServerError(
                    f"processes {survivors} of the CPU policy server's group {pgid} survived SIGKILL"
                )
        self.port = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> CPUPolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
