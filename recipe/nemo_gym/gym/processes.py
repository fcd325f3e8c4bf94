# SPDX-License-Identifier: Apache-2.0
"""The processes a runtime started, how they are stopped, and the process-wide hooks that stop them at exit.

Contract:
- `ProcessTree` holds NeMo Gym's launcher (a child of this process, started in a session of its own) and
  remembers every process of that session and every descendant of the launcher (refreshed on every look, so
  none is lost if its parent dies first).
  `terminate_all(grace_s)` sends the launcher's process group SIGINT (Gym's own shutdown: it interrupts every
  server and stops its Ray), SIGKILLs whatever is left after a bounded grace, and reaps the launcher;
  `kill_all()` sends SIGKILL to every process at once and waits for nothing.
- `LIVE` holds every runtime not yet stopped. `install_exit_hooks()` (once per process) stops them at
  interpreter exit (`shutdown()`) and on SIGTERM (`kill_now()`), then chains the SIGTERM handler already
  installed. Neither hook starts a thread or prints.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from typing import Any, Protocol

import psutil

from recipe.nemo_gym.gym.watchdog import session_members

logger = logging.getLogger(__name__)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def exit_description(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


class ProcessTree:
    """NeMo Gym's launcher and every process it started (its session, and its descendants), by pid."""

    def __init__(self, launcher: subprocess.Popen):
        self.launcher = launcher
        self.sid = launcher.pid  # started with start_new_session: it leads its session and its process group
        self._tracked: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Remember every process of the launcher's session and under the launcher."""
        family = session_members({self.sid})
        with contextlib.suppress(psutil.Error):
            family += psutil.Process(self.launcher.pid).children(recursive=True)
        with self._lock:
            for proc in family:
                known = self._tracked.get(proc.pid)
                if known is None or not known.is_running():
                    self._tracked[proc.pid] = proc

    def launcher_exit_code(self) -> int | None:
        return self.launcher.poll()

    def live(self) -> list[psutil.Process]:
        self.refresh()
        with self._lock:
            return [proc for proc in self._tracked.values() if _alive(proc)]

    def pids(self) -> dict[int, str]:
        names = {}
        for proc in self.live():
            with contextlib.suppress(psutil.Error):
                names[proc.pid] = proc.name()
        return names

    def kill_all(self) -> None:
        """SIGKILL every process, waiting for nothing."""
        with contextlib.suppress(OSError):
            os.killpg(self.sid, signal.SIGKILL)
        for proc in self.live():
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def terminate_all(self, grace_s: float) -> tuple[int, ...]:
        """SIGINT to the launcher's group, SIGKILL what is left after `grace_s`, reap the launcher; the pids that
        survived SIGKILL."""
        procs = self.live()
        if self.launcher_exit_code() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.sid, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in procs + self.live()):
            time.sleep(0.1)
        left = self.live()
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _, alive = psutil.wait_procs(left, timeout=5.0)
        with contextlib.suppress(Exception):
            self.launcher.wait(timeout=1.0)  # reap the launcher (our child) so no zombie stays
        return tuple(p.pid for p in alive if _alive(p))


# ------------------------------------------------------------------------------------ process-wide hooks


class Stoppable(Protocol):
    def shutdown(self) -> None: ...

    def kill_now(self) -> None: ...


LIVE: set[Any] = set()
LIVE_LOCK = threading.RLock()
_HOOKS_INSTALLED = False


def _live() -> list[Stoppable]:
    with LIVE_LOCK:
        return list(LIVE)


def _shutdown_all_live() -> None:
    """atexit: stop every live runtime (a trainer that never called `shutdown()`, as verl's never does)."""
    for runtime in _live():
        try:
            runtime.shutdown()
        except Exception:  # at exit: stop the others regardless
            logger.exception("NeMo Gym runtime shutdown failed")


def _kill_all_live() -> None:
    """On SIGTERM: SIGKILL every live runtime's processes at once (see `GymRuntime.kill_now`)."""
    for runtime in _live():
        with contextlib.suppress(Exception):  # in a signal handler: nothing may keep the others alive
            runtime.kill_now()


def install_exit_hooks() -> None:
    """Once per process: stop live runtimes at interpreter exit and on SIGTERM, chaining the existing handler.

    Where each runs (checked with verl 0.9.1 and Ray 2.60): a trainer script that returns runs atexit. verl's
    TaskRunner is a Ray actor that nothing terminates: when `main_ppo`'s driver returns and exits, Ray sends the
    actor SIGTERM, runs its Python handler, and SIGKILLs it about 0.1 s later, so atexit never runs there and the
    SIGTERM hook must finish in that time: it only sends SIGKILL.
    """
    global _HOOKS_INSTALLED
    with LIVE_LOCK:
        if _HOOKS_INSTALLED:
            return
        _HOOKS_INSTALLED = True
    atexit.register(_shutdown_all_live)
    if threading.current_thread() is not threading.main_thread():
        logger.warning("NeMo Gym runtime started off the main thread: no SIGTERM hook (atexit still stops it)")
        return
    previous = signal.getsignal(signal.SIGTERM)

    def _on_sigterm(signum: int, frame: Any) -> None:
        _kill_all_live()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # SIG_DFL, or a handler installed outside Python: terminate the way SIGTERM would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, _on_sigterm)
