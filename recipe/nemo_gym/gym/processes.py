# SPDX-License-Identifier: Apache-2.0
"""The processes a runtime started, how they are stopped, and the process-wide hooks that stop them at exit.

Contract:
- `ProcessTable` remembers every process under each server's wrapper shell (refreshed on every look, so none
  is lost if its parent dies first), tells `on_new_process` about each one (the runtime's `Watchdog`), reports
  the servers whose wrapper exited, and stops them all:
  `terminate_all(grace_s)` sends SIGTERM, then SIGKILL after a bounded grace, and reaps the wrappers;
  `kill_all()` sends SIGKILL at once and waits for nothing.
- `LIVE` holds every runtime not yet stopped (NeMo Gym keeps one configuration per process, so at most one).
  `install_exit_hooks()` (once per process) stops them at interpreter exit (`shutdown()`) and on SIGTERM
  (`kill_now()`), then chains the SIGTERM handler already installed. Neither hook starts a thread or prints.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psutil

from recipe.nemo_gym.gym.seams import RunHelperView, log_tail

logger = logging.getLogger(__name__)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def exit_description(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


class ProcessTable:
    """Every process one `RunHelper.start` launched, by pid, with the server it belongs to."""

    def __init__(self, view: RunHelperView, on_new_process: Callable[[int], None] = lambda pid: None):
        self.view = view
        self.on_new_process = on_new_process
        self._tracked: dict[int, tuple[str, psutil.Process]] = {}

    def refresh(self) -> None:
        """Remember every process under each server's wrapper, so none is lost if its parent dies first."""
        for name, popen in self.view.processes().items():
            if popen.poll() is not None:
                continue
            try:
                root = psutil.Process(popen.pid)
                family = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in family:
                known = self._tracked.get(proc.pid)
                if known is None or not known[1].is_running():
                    self._tracked[proc.pid] = (name, proc)
                    self.on_new_process(proc.pid)

    def started(self) -> set[str]:
        return set(self.view.processes())

    def dead_servers(self) -> list[tuple[str, int]]:
        """`(server, exit code)` of every server whose wrapper exited."""
        return [(name, popen.returncode) for name, popen in self.view.processes().items() if popen.poll() is not None]

    def pids(self) -> dict[int, str]:
        self.refresh()
        return {pid: name for pid, (name, proc) in self._tracked.items() if _alive(proc)}

    def kill_all(self) -> None:
        """SIGKILL every process, waiting for nothing."""
        self.refresh()
        # list() copies in one step: a health check on the loop thread may be refreshing the table meanwhile.
        for _, proc in list(self._tracked.values()):
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def terminate_all(self, grace_s: float) -> tuple[int, ...]:
        """SIGTERM, SIGKILL what is left after `grace_s`, reap the wrappers; the pids that survived SIGKILL."""
        self.refresh()
        procs = [proc for _, proc in self._tracked.values() if _alive(proc)]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        alive = [p for p in alive if _alive(p)]
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _, alive = psutil.wait_procs(alive, timeout=5.0)
        for popen in self.view.processes().values():
            with contextlib.suppress(Exception):
                popen.wait(timeout=1.0)  # reap the wrappers (our children) so no zombie stays
        return tuple(p.pid for p in alive if _alive(p))


def died_message(dead: Sequence[tuple[str, int]], when: str, log_dir: Any) -> str:
    return "\n".join(
        f"NeMo Gym server {name!r} {exit_description(code)} {when}.{log_tail(log_dir, name)}" for name, code in dead
    )


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
