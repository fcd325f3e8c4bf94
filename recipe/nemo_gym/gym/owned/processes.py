# SPDX-License-Identifier: Apache-2.0
"""The processes a started NeMo Gym runs as, and how they are stopped.

Contract:
- `ProcessTree` holds NeMo Gym's launcher (a child of this process, started in a session of its own) and
  remembers every process of that session and every descendant of the launcher (refreshed on every look, so
  none is lost if its parent dies first).
  `terminate_all(grace_s)` stops the launcher's process group with `process_group.stop_group`: SIGINT (Gym's own
  shutdown: it interrupts every server and stops its Ray), SIGKILL to whatever is left after a bounded grace; then
  SIGKILL to any remembered process outside the group, and reaps the launcher;
  `kill_all()` sends SIGKILL to every process at once and waits for nothing.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading

import psutil

from recipe.nemo_gym.gym.watchdog import session_members
from recipe.nemo_gym.process_group import signal_group, stop_group

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
        signal_group(self.sid, signal.SIGKILL)
        for proc in self.live():
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def terminate_all(self, grace_s: float) -> tuple[int, ...]:
        """SIGINT to the launcher's group and SIGKILL to what is left of it after `grace_s` (`stop_group`), then
        SIGKILL to any process of the launcher's session or tree outside that group; reap the launcher. The pids that
        survived SIGKILL."""
        self.refresh()  # every member known before the group goes, so that one that leaves it is still found
        first = signal.SIGINT if self.launcher_exit_code() is None else None
        stop_group(self.sid, grace_s, first=first)
        left = self.live()
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _, alive = psutil.wait_procs(left, timeout=5.0)
        with contextlib.suppress(Exception):
            self.launcher.wait(timeout=1.0)  # reap the launcher (our child) so no zombie stays
        return tuple(p.pid for p in alive if _alive(p))
