# SPDX-License-Identifier: Apache-2.0
"""`GymRuntime`: one NeMo Gym 0.4.0 configuration started offline, supervised, and stopped with nothing left.

Contract:
- `GymRuntime.start(spec, loop=...)` starts every server of `spec.config_paths` (plus the training model server
  config) with NeMo Gym's own `RunHelper.start`, offline: each server's venv is a link to a shim that runs this
  process's interpreter (`sys.executable`), so no server builds a venv and nothing needs the network. It
  returns only once every server answers HTTP, within `spec.startup_timeout_s`. Before anything starts it
  checks that every config path exists (`seams.check_config_paths`) and that the head server's port is free.
  If a server dies or the deadline passes, everything started is stopped and the error names the servers
  concerned. At most one runtime is live per process (NeMo Gym keeps one configuration per process).
- `loop` is the caller's `BackgroundLoop` (in production the agent loop manager's, the only one it creates),
  borrowed, never created or closed here: every `collect` must run on it, because NeMo Gym's process-wide
  aiohttp session is created on the loop of the first request and bound to it, and `shutdown` closes that
  session there.
- `health()` / `check_health()` are cheap (process liveness; HTTP only on request) and name dead servers.
- `await collect(examples, deadline_s)` runs the batch (`collect.run_examples_in_order`) on the running loop,
  which must be `loop` (anything else raises `RuntimeError` before a request goes out); it enters no loop
  itself. It health-checks NeMo Gym's servers and the policy servers (`spec.policy_health_failures`
  consecutive probes without an answer abort it) while it waits.
- `shutdown()` stops the head server and every process started (each server's wrapper and all of its
  descendants: SIGTERM, then SIGKILL after `spec.shutdown_grace_s`), then closes NeMo Gym's HTTP session on
  `loop` (skipped if the loop is already closed). Idempotent; also runs at interpreter exit (verl never calls
  it), without starting a thread and without printing anything. On SIGTERM of this process every process
  started is sent SIGKILL at once (`kill_now`; a Ray actor such as verl's TaskRunner is SIGKILLed ~0.1 s after
  its SIGTERM), then the SIGTERM handler already installed runs (`processes.install_exit_hooks`).
- If this process ends with no hook run at all (SIGKILL; Ray ending a worker, which also SIGKILLs the worker's
  children, i.e. the servers' wrapper shells), a `watchdog.Watchdog` process started with the servers SIGKILLs
  every one of them at once.

NeMo Gym 0.4.0's `RunHelper.start` waits for servers with no deadline and cleans nothing up if it raises, and
its `shutdown()` only signals the wrapper shells. So `start` runs on a helper thread under our deadline, and
teardown is ours (`processes.ProcessTable`, over `seams.RunHelperView`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import RolloutAborted
from recipe.nemo_gym.gym import seams
from recipe.nemo_gym.gym.collect import (
    ProgressLine,
    RowOutcome,
    make_post_run,
    run_examples_in_order,
    validate_examples,
)
from recipe.nemo_gym.gym.errors import (
    GymConfigError,
    GymRuntimeError,
    GymServerDied,
    GymStartTimeout,
    HeadPortInUseError,
)
from recipe.nemo_gym.gym.health import (
    HealthReport,
    PolicyWatch,
    ServerHealth,
    check_server_health,
    http_alive,
    server_health,
)
from recipe.nemo_gym.gym.processes import LIVE, LIVE_LOCK, ProcessTable, died_message, install_exit_hooks
from recipe.nemo_gym.gym.spec import AGENT_SERVER_TYPE, GymServersSpec, ServerInstance, build_global_config_dict
from recipe.nemo_gym.gym.watchdog import Watchdog

logger = logging.getLogger(__name__)


def port_holder(host: str, port: int) -> str | None:
    """`pid N (name)` of a process listening on `port`, when the OS lets us see it."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                with contextlib.suppress(psutil.Error):
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                return f"pid {conn.pid}"
    except (psutil.Error, OSError):
        pass
    return None


def check_port_free(host: str, port: int) -> None:
    """Raise `HeadPortInUseError` unless `host:port` can be bound the way uvicorn binds it (SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            holder = port_holder(host, port)
            by = f" by {holder}" if holder else ""
            raise HeadPortInUseError(
                f"NeMo Gym head server port {host}:{port} is already in use{by} ({e.strerror}). "
                "Choose another head_server_port, or stop whatever holds it (another run's NeMo Gym?)."
            ) from None


def _running_ray_address() -> str:
    import ray

    if not ray.is_initialized():
        raise GymConfigError(
            "GymServersSpec.ray_head_node_address is not set and this process is not connected to Ray: "
            "give the address of the running Ray head (e.g. ray.get_runtime_context().gcs_address)"
        )
    return ray.get_runtime_context().gcs_address


class GymRuntime:
    """A started NeMo Gym configuration. Build with `GymRuntime.start(spec, loop=...)`; stop with `shutdown()`."""

    def __init__(self, spec: GymServersSpec, loop: BackgroundLoop):
        self.spec = spec
        self.loop = loop  # borrowed: the caller created it and closes it, after `shutdown()`
        self.servers: tuple[ServerInstance, ...] = ()
        self.startup_s: float | None = None
        self._ng: seams.NeMoGymAPI | None = None
        self._table: ProcessTable | None = None
        self._watchdog: Watchdog | None = None
        self._server_client: Any = None
        self._lock = threading.RLock()
        self._stopped = False
        self.survivors: tuple[int, ...] = ()

    # ---------------------------------------------------------------- start

    @classmethod
    def start(cls, spec: GymServersSpec, *, loop: BackgroundLoop) -> GymRuntime:
        """Start every server and wait until all answer HTTP; on any failure nothing started is left running.

        `loop` is the event loop every `collect` will run on (see the module docstring); it is not used to start.
        """
        seams.check_config_paths(spec.all_config_paths, Path.cwd(), seams.nemo_gym_install_root())
        with LIVE_LOCK:
            live = [r for r in LIVE if not r._stopped]
            if live:
                raise GymRuntimeError(
                    "a NeMo Gym runtime is already live in this process (head server "
                    f"{live[0].spec.head_server_host}:{live[0].spec.head_server_port}); NeMo Gym keeps one "
                    "configuration per process, so shut that one down first"
                )
            check_port_free(spec.head_server_host, spec.head_server_port)
            runtime = cls(spec, loop)
            LIVE.add(runtime)
        install_exit_hooks()
        try:
            runtime._start()
        except BaseException:
            runtime.shutdown()
            raise
        return runtime

    def _start(self) -> None:
        t0 = time.monotonic()
        spec = self.spec
        ng = self._ng = seams.load_nemo_gym()
        ray_address = spec.ray_head_node_address or _running_ray_address()
        cache = spec.resolved_cache_dir()
        venv_dir = spec.venv_dir or cache / "nemo_gym_venvs"
        global_config = build_global_config_dict(spec, ray_address, venv_dir, cache / "uv")
        parser_config = seams.parser_config(ng, global_config, spec.load_env_yaml)
        config = seams.parse_config(ng, parser_config)
        self.servers = tuple(seams.server_instances(config, ng.reserved_top_level_keys))
        if not self.servers:
            raise GymConfigError(f"no NeMo Gym servers in config paths {list(spec.all_config_paths)}")
        shim = seams.write_interpreter_shim(venv_dir, sys.executable)
        seams.link_server_venvs(venv_dir, [s.server_dir for s in self.servers], shim)

        run_helper = ng.RunHelper()
        self._watchdog = Watchdog.spawn()  # before any server: none may outlive this process unwatched
        table = self._table = ProcessTable(seams.RunHelperView(run_helper), on_new_process=self._watchdog.register)
        start_error: list[BaseException] = []

        def _run_start() -> None:
            try:
                run_helper.start(parser_config)  # returns the config cached by parse_config
            except BaseException as e:  # reported by the waiting thread
                start_error.append(e)

        starter = threading.Thread(target=_run_start, name="nemo-gym-start", daemon=True)
        starter.start()
        deadline = t0 + spec.startup_timeout_s
        while True:
            starter.join(0.25)
            table.refresh()
            dead = table.dead_servers()
            if dead:
                message = died_message(dead, "during start-up", spec.log_dir)
                raise GymServerDied(message, [name for name, _ in dead])
            if table.view.head_thread_alive() is False:
                raise GymServerDied(
                    f"NeMo Gym head server {spec.head_server_host}:{spec.head_server_port} stopped during start-up",
                    ["head_server"],
                )
            if not starter.is_alive():
                if start_error:
                    raise GymRuntimeError(f"NeMo Gym RunHelper.start failed: {start_error[0]!r}") from start_error[0]
                break
            if time.monotonic() > deadline:
                not_ready = [s.name for s in self.servers if not (s.host and http_alive(s.host, s.port, 1.0))]
                raise GymStartTimeout(
                    f"NeMo Gym servers not ready within {spec.startup_timeout_s:g}s; not answering HTTP: "
                    f"{not_ready or 'none (start-up was still finishing)'}",
                    not_ready,
                )
        table.refresh()
        self.startup_s = time.monotonic() - t0
        logger.info("NeMo Gym: %d servers ready in %.1fs", len(self.servers), self.startup_s)

    # ---------------------------------------------------------------- processes and health

    @property
    def agent_names(self) -> frozenset[str]:
        """The agent servers rows can name in `agent_ref.name`."""
        return frozenset(s.name for s in self.servers if s.server_type == AGENT_SERVER_TYPE)

    def pids(self) -> dict[int, str]:
        """Every live process this runtime started (server wrappers and their descendants), by pid."""
        return self._table.pids() if self._table is not None else {}

    def health(self, http_timeout_s: float | None = None) -> HealthReport:
        """Process liveness of every server (and, with `http_timeout_s`, whether each answers HTTP)."""
        if self._stopped:
            return HealthReport(tuple(ServerHealth(s.name, False, "runtime shut down") for s in self.servers))
        return server_health(self.servers, self._table, http_timeout_s)

    def check_health(self, http_timeout_s: float | None = None) -> None:
        """Raise `GymServerDied` naming every dead server; cheap enough to call every few seconds."""
        if self._stopped:
            raise GymServerDied("NeMo Gym runtime is shut down", [s.name for s in self.servers])
        check_server_health(self.health(http_timeout_s), self._table, self.spec.log_dir)

    # ---------------------------------------------------------------- rollouts

    async def collect(
        self,
        examples: Sequence[Mapping[str, Any]],
        deadline_s: float,
        health_check_interval_s: float,
    ) -> list[RowOutcome]:
        """Run every row on its agent; results in input order. Await it on `self.loop` (the caller's loop).

        Both times come from the plugin config (`timeouts.batch_s`, `timeouts.health_check_interval_s`)."""
        self._check_not_stopped()
        if asyncio.get_running_loop() is not self.loop.loop:
            raise RuntimeError(
                f"GymRuntime.collect must run on the loop given to GymRuntime.start ({self.loop.name!r}): NeMo "
                "Gym's HTTP session is bound to it; await it there, e.g. `await runtime.loop.arun(...)`"
            )
        ng = self._ng
        validate_examples(examples, self.agent_names)
        if self._server_client is None:
            self._server_client = seams.server_client(ng, self.spec.head_server_host, self.spec.head_server_port)
        spec = self.spec
        watch = PolicyWatch(spec.policy_base_urls, spec.policy_health_timeout_s, spec.policy_health_failures)

        async def health() -> None:
            self.check_health()
            # NeMo Gym's model server retries a policy server that does not answer forever: watch those too.
            await watch.check()

        return await run_examples_in_order(
            examples,
            post_run=make_post_run(self._server_client, ng),
            deadline_s=deadline_s,
            health_check=health,
            health_check_interval_s=health_check_interval_s,
            progress=ProgressLine(),
        )

    def _check_not_stopped(self) -> None:
        if self._stopped:
            raise RolloutAborted("NeMo Gym runtime is shut down: no batch can run")

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Stop the head server and every process started; leave none behind. Idempotent.

        The processes go first: nothing after them (closing the HTTP session, which touches the event loop) can
        keep a server alive. Creates a thread only when called from a thread that runs an event loop (see
        `seams.close_global_session`), never at interpreter exit.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            try:
                if self._table is not None:
                    self._table.view.stop_head_server(timeout_s=5.0)
            finally:
                if self._table is not None:
                    self.survivors = self._table.terminate_all(self.spec.shutdown_grace_s)
                if self._watchdog is not None:
                    self._watchdog.release(wait_s=5.0)  # after our own stop: it finds nothing left to kill
                if self.survivors:
                    logger.error("NeMo Gym processes survived SIGKILL: %s", self.survivors)
            if self._ng is not None:
                seams.close_global_session(self._ng, self.loop)
                self._server_client = None
        finally:
            with LIVE_LOCK:
                LIVE.discard(self)

    def kill_now(self) -> None:
        """SIGKILL every process started, without waiting or touching the event loop; for a SIGTERM of this process.

        A trainer being terminated has little time left: Ray SIGKILLs an actor ~0.1 s after its SIGTERM (measured
        with Ray 2.60 for verl's TaskRunner, whose owner, the `main_ppo` driver, exited), so a grace period would be
        cut short, and the servers hold nothing worth a graceful exit (environment state lives per episode). The
        head server is a thread of this process and ends with it. Idempotent; later `shutdown()` calls do nothing.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            if self._table is not None:
                self._table.kill_all()
        finally:
            if self._watchdog is not None:
                # It kills again whatever a cut-short kill_all missed; it exits in milliseconds, so waiting for
                # it keeps a caller that checks for survivors right after this process exits from seeing it.
                self._watchdog.release(wait_s=1.0)
            with LIVE_LOCK:
                LIVE.discard(self)

    def __enter__(self) -> GymRuntime:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
