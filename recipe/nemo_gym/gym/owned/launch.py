# SPDX-License-Identifier: Apache-2.0
"""`OwnedGym`: one NeMo Gym configuration the plugin starts out of process, supervises and stops, leaving nothing.

Contract:
- `OwnedGym.start(config, policy, loop=...)` takes the validated environments file (`config.NeMoGymConfig`) and verl's
  policy servers (`PolicyServers`). It finds Gym's Python environment (`environment.py`; its nemo-gym release, 0.4.x or
  0.7.x, is read from it, and any other is refused naming it), checks that every config path exists and that the head
  server's port is free, then starts Gym's own launcher (`gym env start`, `ng_run` on 0.4) from that environment as a
  process tree of its own: a new session, SIGINT at its default action, no `RAY_*` variable and a private `RAY_TMPDIR`,
  under `lean_ray.py` (a private Ray for Gym, never the trainer's, without Ray's dashboard or prestarted workers),
  offline (each server's venv is a link to a shim that runs the Gym environment's interpreter, so no server builds a
  venv). Gym reads the plugin's keys last (`global_config.global_config`; with them the judge's,
  `global_config.judge_overrides`, which also refuses a resources server whose judge no config defines before anything
  starts). It returns once the head server lists the servers and every one answers HTTP, within `timeouts.startup_s`. If
  the launcher or a server dies, or the deadline passes, everything started is stopped and the error names what failed
  and shows the last lines of its log. A head server that could not bind its port (taken between the check and Gym's
  bind) is named as soon as the launcher logs it (`head_server_bind_error`): Gym 0.7's launcher would wait for it until
  the deadline. One start-up failure is retried, up to `RAY_START_ATTEMPTS` starts in all, within the same deadline and
  a few seconds apart: Gym's launcher ending because its Ray missed Ray's fixed start-up deadline
  (`launcher_missed_ray_start`), which a CPU-starved node can cause (twice in a row, on a 2-core machine starting two
  other Rays) and a later start does not meet again.
- Nothing of NeMo Gym is imported here. Rows reach Gym through `connection` (`over_http.connection.GymConnection`,
  on the caller's `loop`, borrowed: never created or closed here), whose health check while a batch waits is this
  Gym's `check_health`.
- `health()` / `check_health()` are cheap (process liveness of the launcher and of every server, `liveness.py`;
  HTTP only on request) and name dead servers.
- `shutdown()` sends the launcher's process group SIGINT (Gym's own orderly stop: its servers, then its Ray),
  SIGKILLs whatever is left after `timeouts.shutdown_grace_s`, removes the run's private folder (the job config,
  Ray's session files, the logs unless `nemo_gym.log_dir` keeps them elsewhere), then closes the connection (its aiohttp
  session, on `loop`, skipped if the loop is already closed). Idempotent; also runs at interpreter exit (verl
  never calls it). On SIGTERM of this process every process started is sent SIGKILL at once (`kill_now`; a Ray
  actor such as verl's TaskRunner is SIGKILLed ~0.1 s after its SIGTERM), then the SIGTERM handler already
  installed runs (`exit_hooks.py`).
- If this process ends with no hook run at all (SIGKILL; Ray ending a worker), a `watchdog.Watchdog` process
  started before the launcher SIGKILLs every process of the launcher's session at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym import exit_hooks
from recipe.nemo_gym.gym.errors import GymServerDied, GymStartTimeout, HeadPortInUseError
from recipe.nemo_gym.gym.over_http.client import HeadClient, ServerInstance
from recipe.nemo_gym.gym.over_http.connection import GymConnection
from recipe.nemo_gym.gym.over_http.health import wait_until_answering
from recipe.nemo_gym.gym.over_http.limits import ConnectionLimits
from recipe.nemo_gym.gym.owned import gym_layout
from recipe.nemo_gym.gym.owned.environment import (
    GymEnvironment,
    clean_environment,
    inspect_environment,
    launcher_argv,
    locate_environment,
)
from recipe.nemo_gym.gym.owned.global_config import (
    cache_root,
    deep_merged,
    global_config,
    gym_overrides,
    judge_overrides,
    merged_config,
    replica_keys,
)
from recipe.nemo_gym.gym.owned.liveness import (
    LAUNCHER,
    HealthReport,
    ServerHealth,
    check_server_health,
    server_health,
)
from recipe.nemo_gym.gym.owned.processes import ProcessTree, exit_description
from recipe.nemo_gym.gym.types import PolicyServers
from recipe.nemo_gym.gym.watchdog import Watchdog
from recipe.nemo_gym.ports import bind_problem
from recipe.nemo_gym.ray_start import RAY_START_TIMEOUT, missed_ray_start

logger = logging.getLogger(__name__)

LAUNCHER_LOG = "gym_launcher.log"
JOB_CONFIG = "verl_job.yaml"
_POLL_S = 1.0
# How Gym's launcher names a server whose process ended during start-up (RunHelper.poll, 0.4.0 and 0.7.0).
_FINISHED = re.compile(r"Process `([^`]+)` finished unexpectedly")
# asyncio's error when a listening socket cannot bind (`loop.create_server`), which uvicorn logs before it exits.
_BIND_ERROR = re.compile(r"\[Errno \d+\] error while attempting to bind on address \('[^']*', (?P<port>\d+)\)[^\n]*")
HEAD_SERVER = "head_server"
# `lean_ray.py` starts Gym's Ray and exits with it, so Gym's launcher ends on Ray's start-up deadline (`ray_start.py`).
RAY_START_ATTEMPTS = 3
_RAY_RETRY_PAUSE_S = 5.0  # lets the load that starved the first start pass


def head_server_bind_error(launcher_log: str, port: int) -> str | None:
    """The error with which Gym's head server could not listen on `port`, as its launcher logged it, else None.
    uvicorn logs asyncio's bind error and ends the head server's thread; Gym 0.7's launcher does not notice until
    the head port answers (it waits for any HTTP answer there, from whatever holds it, forever otherwise), and then
    ends with "Head server finished unexpectedly!"."""
    for found in _BIND_ERROR.finditer(launcher_log):
        if int(found.group("port")) == port:
            return found.group(0).strip()
    return None


def launcher_missed_ray_start(error: BaseException) -> bool:
    """Whether a start-up failure is Gym's launcher ending on Ray's start-up deadline (its log tail, in the message)."""
    return isinstance(error, GymServerDied) and LAUNCHER in error.servers and missed_ray_start(str(error))


def check_port_free(host: str, port: int) -> None:
    """Raise `HeadPortInUseError` unless `host:port` can be bound the way uvicorn binds it (`ports.bind_problem`)."""
    problem = bind_problem(host, port)
    if problem is not None:
        raise HeadPortInUseError(
            f"NeMo Gym head server port {host}:{port} is already in use{problem}. "
            "Choose another nemo_gym.head_server.port, or stop whatever holds it (another run's NeMo Gym?)."
        )


class OwnedGym:
    """A NeMo Gym the plugin started. Build with `OwnedGym.start(config, policy, loop=...)`; stop with `shutdown()`.

    `connection` (`over_http.connection.GymConnection`) is how rows reach it; this object owns its processes."""

    def __init__(self, config: NeMoGymConfig, policy: PolicyServers, loop: BackgroundLoop, overrides: dict):
        self.config = config
        self.policy = policy
        self.loop = loop  # borrowed: see the module docstring
        # Gym's global-config keys from the environments file (`global_config.gym_overrides`)
        self.overrides = overrides
        self.connection: GymConnection | None = None
        self.servers: tuple[ServerInstance, ...] = ()
        self.startup_s: float | None = None
        self.environment: GymEnvironment | None = None
        self.run_dir: Path | None = None
        self.log_dir: Path | None = None
        self.launcher_log: Path | None = None
        self._tree: ProcessTree | None = None
        self._watchdog: Watchdog | None = None
        self.survivors: tuple[int, ...] = ()
        self._stop = exit_hooks.StopOnce()

    @property
    def version(self) -> str | None:
        """The nemo-gym release running, as its environment reported it."""
        return self.environment.version if self.environment is not None else None

    @property
    def config_paths(self) -> list[str]:
        """The config files Gym is started with (`nemo_gym.config_paths`, under `nemo_gym.root` when it is set)."""
        return self.config.nemo_gym.rooted_config_paths()

    # ---------------------------------------------------------------- start

    @classmethod
    def start(
        cls,
        config: NeMoGymConfig,
        policy: PolicyServers,
        *,
        loop: BackgroundLoop,
        limits: ConnectionLimits | None = None,
    ) -> OwnedGym:
        """Start Gym and wait until every server answers; on any failure nothing started is left running.

        `loop` is the event loop every `connection.collect` will run on (see the module docstring); it is not used
        to start. `limits` go into Gym's global config under the user's `nemo_gym.config_overrides`, and bound the
        connection's own HTTP session. A launcher that ended on Ray's start-up deadline is started again, up to
        `RAY_START_ATTEMPTS` starts in all, within the same deadline.
        """
        deadline = time.monotonic() + config.timeouts.startup_s
        overrides = gym_overrides(config.nemo_gym, limits)
        for attempt in range(1, RAY_START_ATTEMPTS):
            try:
                return cls._start_once(config, policy, loop, overrides, deadline)
            except GymServerDied as e:
                if not launcher_missed_ray_start(e) or deadline - time.monotonic() < 2 * _RAY_RETRY_PAUSE_S:
                    raise
                logger.warning(
                    "NeMo Gym's launcher ended because its Ray missed Ray's 30 s start-up deadline (%r; a busy node); "
                    "starting NeMo Gym again (start %d of at most %d)",
                    RAY_START_TIMEOUT, attempt + 1, RAY_START_ATTEMPTS,
                )  # fmt: skip
                time.sleep(_RAY_RETRY_PAUSE_S)
        return cls._start_once(config, policy, loop, overrides, deadline)  # the last start's failure is the caller's

    @classmethod
    def _start_once(
        cls, config: NeMoGymConfig, policy: PolicyServers, loop: BackgroundLoop, overrides: dict, deadline: float
    ) -> OwnedGym:
        section = config.nemo_gym
        environment = inspect_environment(locate_environment(section.environment))
        files = gym_layout.check_config_paths(section.rooted_config_paths(), Path.cwd(), environment.install_root)
        merged = merged_config(files, overrides)
        if section.replicas:
            copies = replica_keys(section.replicas, merged, files)
            overrides, merged = {**overrides, **copies}, deep_merged(merged, copies)
        judge = judge_overrides(section, policy, merged, files)
        if judge:
            overrides = deep_merged(overrides, judge)
        check_port_free(section.head_server.host, section.head_server.port)
        gym = cls(config, policy, loop, overrides)
        gym.environment = environment
        exit_hooks.register(gym)
        try:
            gym._start(deadline)
        except BaseException:
            gym.shutdown()
            raise
        return gym

    def _start(self, deadline: float) -> None:
        t0 = time.monotonic()
        section, environment = self.config.nemo_gym, self.environment
        assert environment is not None
        cache = cache_root()
        venv_dir = section.venv_dir or gym_layout.default_venv_dir(cache, str(environment.python))
        shim = gym_layout.write_interpreter_shim(venv_dir, str(environment.python))
        roots = [environment.install_root, Path.cwd(), *gym_layout.extra_roots(os.environ)]
        gym_layout.link_server_venvs(venv_dir, gym_layout.server_dirs(roots), shim)

        # A short private folder: Ray's socket paths under it must stay within the 107 bytes a Unix socket allows.
        self.run_dir = Path(tempfile.mkdtemp(prefix="ng-gym-", dir="/tmp" if Path("/tmp").is_dir() else None))
        job_config = self.run_dir / JOB_CONFIG
        # Gym writes one log per server there (`nemo_gym_log_dir`): a private folder unless the user keeps them.
        self.log_dir = section.log_dir or self.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.launcher_log = self.log_dir / LAUNCHER_LOG
        job = global_config(section, self.policy, self.overrides, venv_dir, cache / "uv", self.log_dir)
        job_config.write_text(yaml.safe_dump(job, sort_keys=False))
        env = clean_environment(os.environ)
        env.update(RAY_TMPDIR=str(self.run_dir / "ray"), PYTHONUNBUFFERED="1")
        argv = launcher_argv(environment, [*self.config_paths, str(job_config)])

        self._watchdog = Watchdog.spawn()  # before the launcher: no Gym process may outlive this one unwatched
        with open(self.launcher_log, "ab") as log:
            launcher = subprocess.Popen(
                argv, cwd=Path.cwd(), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        # The session holds the whole tree (servers, Gym's Ray): the watchdog needs no pid of it one by one, and
        # watching ~30 pids' descendants every second cost it a tenth of a core.
        self._watchdog.register_session(launcher.pid)
        self._watchdog.register(launcher.pid)
        self._watchdog.remove_on_exit(str(self.run_dir))
        self._tree = ProcessTree(launcher)
        logger.info(
            "NeMo Gym %s starting from %s (pid %d, log %s)",
            environment.version, environment.python, launcher.pid, self.launcher_log,
        )  # fmt: skip
        self._wait_until_ready(deadline)
        self.startup_s = time.monotonic() - t0
        logger.info("NeMo Gym %s: %d servers ready in %.1fs", environment.version, len(self.servers), self.startup_s)

    def _wait_until_ready(self, deadline: float) -> None:
        section, tree = self.config.nemo_gym, self._tree
        assert tree is not None
        head = HeadClient(section.head_server.host, section.head_server.port, timeout_s=5.0)

        def still_starting(servers: list[ServerInstance]) -> None:
            tree.refresh()
            code = tree.launcher_exit_code()
            if code is not None:
                self._raise_launcher_died(code, "during start-up")
            if not servers:  # the head server lists none yet: did it fail to listen?
                self._raise_if_head_could_not_listen(None, "during start-up")
            dead = [s.name for s in server_health(servers, None).servers if not s.alive]
            if dead:
                raise GymServerDied(f"NeMo Gym server(s) {dead} died during start-up.{self._log_tail(dead[0])}", dead)

        servers, not_ready = wait_until_answering(head, deadline, _POLL_S, still_starting)
        if not servers or not_ready:
            what = (
                f"not answering HTTP: {not_ready}"
                if servers
                else f"the head server {head.url} never listed its servers"
            )
            raise GymStartTimeout(
                f"NeMo Gym servers not ready within {self.config.timeouts.startup_s:g}s; {what}."
                f"{gym_layout.file_tail(self.launcher_log)}",
                not_ready or [HEAD_SERVER],
            )
        gym_config = head.config()
        self.servers = tuple(servers)  # before the checks below: a shutdown after them still knows the servers
        self.connection = GymConnection.adopt(
            self.loop,
            gym_config,
            servers,
            str(self.config_paths),
            policy=self.policy,
            timeouts=self.config.timeouts,
            check_gym=self._check_gym,
            connector_limits=self.overrides,
            judge_urls=self.config.nemo_gym.judge.base_urls if self.config.nemo_gym.judge else (),
        )
        tree.refresh()

    def _raise_launcher_died(self, code: int, when: str) -> None:
        self._raise_if_head_could_not_listen(code, when)
        text = self._launcher_log_text()
        named = sorted(set(_FINISHED.findall(text)))
        what = f"server(s) {named} ended {when}, and its launcher" if named else f"launcher ended {when}: it"
        tail = self._log_tail(named[0]) if named else gym_layout.file_tail(self.launcher_log)
        raise GymServerDied(f"NeMo Gym's {what} {exit_description(code)}.{tail}", named or [LAUNCHER])

    def _raise_if_head_could_not_listen(self, code: int | None, when: str) -> None:
        """Raise `GymServerDied` naming the head server if the launcher's log says it could not bind its port."""
        head = self.config.nemo_gym.head_server
        error = head_server_bind_error(self._launcher_log_text(), head.port)
        if error is None:
            return
        why = (
            " The port was free when the plugin checked it just before starting Gym: another process took it "
            "meanwhile (choose nemo_gym.head_server.port outside the kernel's ephemeral port range)."
            if "in use" in error
            else ""
        )
        launcher = "" if code is None else f" Its launcher {exit_description(code)}."
        raise GymServerDied(
            f"NeMo Gym's head server could not listen on {head.host}:{head.port} {when}: {error}.{why}{launcher}"
            f"{gym_layout.file_tail(self.launcher_log)}",
            [HEAD_SERVER],
        )

    def _launcher_log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.launcher_log.read_text(errors="replace") if self.launcher_log else ""
        return ""

    # ---------------------------------------------------------------- processes and health

    def pids(self) -> dict[int, str]:
        """Every live process this runtime started (the launcher, its servers, its Ray), by pid: the name of the
        server it belongs to (a server's wrapper shell and everything under it), else its process name."""
        if self._tree is None:
            return {}
        wrappers = {s.pid: s.name for s in self.servers if s.pid is not None}
        named = {}
        for pid, process_name in self._tree.pids().items():
            named[pid] = wrappers.get(pid, process_name)
            with contextlib.suppress(psutil.Error):
                for parent in psutil.Process(pid).parents():
                    if parent.pid in wrappers:
                        named[pid] = wrappers[parent.pid]
                        break
        return named

    def health(self, http_timeout_s: float | None = None) -> HealthReport:
        """Process liveness of every server and the launcher (and, with `http_timeout_s`, HTTP answers)."""
        if self._stop.claimed:
            return HealthReport(tuple(ServerHealth(s.name, False, "runtime shut down") for s in self.servers))
        return server_health(self.servers, self._tree, http_timeout_s)

    def check_health(self, http_timeout_s: float | None = None) -> None:
        """Raise `GymServerDied` naming every dead server; cheap enough to call every few seconds."""
        if self._stop.claimed:
            raise GymServerDied("NeMo Gym runtime is shut down", [s.name for s in self.servers])
        check_server_health(self.health(http_timeout_s), self._log_tail)

    def _log_tail(self, server: str) -> str:
        """A dead server's own log (Gym writes one per server), else the launcher's (every server's lines)."""
        return gym_layout.log_tail(self.log_dir, server) or gym_layout.file_tail(self.launcher_log)

    async def _check_gym(self) -> None:
        self.check_health()

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Stop every process started and remove the run's private folder; leave nothing behind. Idempotent.

        The processes go first: nothing after them (closing the HTTP session, which touches the event loop) can
        keep a server alive.
        """
        if not self._stop.claim():
            return
        if self.connection is not None:
            self.connection.closed = True  # no batch starts from here on; the session is closed last
        try:
            try:
                if self._tree is not None:
                    self.survivors = self._tree.terminate_all(self.config.timeouts.shutdown_grace_s)
            finally:
                if self._watchdog is not None:
                    self._watchdog.release(wait_s=5.0)  # after our own stop: it finds nothing left to kill
                if self.survivors:
                    logger.error("NeMo Gym processes survived SIGKILL: %s", self.survivors)
                self._remove_run_dir()
            if self.connection is not None:
                self.connection.close()
        finally:
            exit_hooks.forget(self)

    def kill_now(self) -> None:
        """SIGKILL every process started, without waiting or touching the event loop; for a SIGTERM of this process.

        A trainer being terminated has little time left: Ray SIGKILLs an actor ~0.1 s after its SIGTERM (measured
        with Ray 2.60 for verl's TaskRunner, whose owner, the `main_ppo` driver, exited), so a grace period would be
        cut short, and the servers hold nothing worth a graceful exit (environment state lives per episode).
        Idempotent; later `shutdown()` calls do nothing.
        """
        if not self._stop.claim():
            return
        try:
            if self._tree is not None:
                self._tree.kill_all()
        finally:
            if self._watchdog is not None:
                # It kills again whatever a cut-short kill_all missed, then deletes the run's folder; it exits in
                # milliseconds, so waiting for it keeps a caller that checks for survivors right after this process
                # exits from seeing it.
                self._watchdog.release(wait_s=1.0)
            if self.connection is not None:
                self.connection.closed = True  # no batch after this; the session is not touched in a signal handler
            exit_hooks.forget(self)

    def _remove_run_dir(self) -> None:
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> OwnedGym:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
