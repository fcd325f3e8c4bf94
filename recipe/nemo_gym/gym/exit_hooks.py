# SPDX-License-Identifier: Apache-2.0
"""What a trainer process stops when it exits without stopping NeMo Gym itself (verl never calls `shutdown()`).

Contract:
- `register(gym)` adds a started or attached Gym (anything with `shutdown()` and `kill_now()`), `forget(gym)`
  removes it; each Gym calls `forget` as its own stop ends. The first `register` in a process installs the hooks.
- At interpreter exit every registered Gym gets `shutdown()` (the orderly stop); on SIGTERM, `kill_now()` (what fits
  in the ~0.1 s Ray leaves an actor), and then the SIGTERM handler installed before runs. Neither hook starts a
  thread or prints.
- `StopOnce` is the claim both stops of a Gym make first: whichever of `shutdown()` and `kill_now()` comes first
  acts, every later call returns at once (a SIGTERM may arrive while `shutdown()` runs).
- What each Gym stops is its own business: a started Gym's process tree (`owned/launch.py`), an attached Gym's
  published policy address and relay (`attach.py`), never an attached Gym's processes.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class Stoppable(Protocol):
    def shutdown(self) -> None: ...

    def kill_now(self) -> None: ...


class StopOnce:
    """`claim()` is True for the first caller only. Re-entrant: `kill_now` runs in a signal handler, which may
    interrupt the thread that is inside `shutdown`."""

    def __init__(self) -> None:
        self.claimed = False
        self._lock = threading.RLock()

    def claim(self) -> bool:
        with self._lock:
            if self.claimed:
                return False
            self.claimed = True
            return True


_REGISTERED: set[Any] = set()
_LOCK = threading.RLock()
_INSTALLED = False


def register(gym: Stoppable) -> None:
    """Stop `gym` when this process exits, unless it was forgotten first; installs the hooks once per process."""
    with _LOCK:
        _REGISTERED.add(gym)
    _install()


def forget(gym: Stoppable) -> None:
    with _LOCK:
        _REGISTERED.discard(gym)


def _registered() -> list[Stoppable]:
    with _LOCK:
        return list(_REGISTERED)


def _shutdown_all() -> None:
    """atexit: stop every registered Gym (a trainer that never called `shutdown()`, as verl's never does)."""
    for gym in _registered():
        try:
            gym.shutdown()
        except Exception:  # at exit: stop the others regardless
            logger.exception("NeMo Gym shutdown at exit failed")


def _kill_all() -> None:
    """On SIGTERM: `kill_now()` every registered Gym at once (see `OwnedGym.kill_now`)."""
    for gym in _registered():
        with contextlib.suppress(Exception):  # in a signal handler: nothing may keep the others alive
            gym.kill_now()


def _install() -> None:
    """Once per process: stop registered Gyms at interpreter exit and on SIGTERM, chaining the existing handler.

    Where each runs (checked with verl 0.9.1 and Ray 2.60): a trainer script that returns runs atexit. verl's
    TaskRunner is a Ray actor that nothing terminates: when `main_ppo`'s driver returns and exits, Ray sends the
    actor SIGTERM, runs its Python handler, and SIGKILLs it about 0.1 s later, so atexit never runs there and the
    SIGTERM hook must finish in that time: it only sends SIGKILL.
    """
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
    atexit.register(_shutdown_all)
    if threading.current_thread() is not threading.main_thread():
        logger.warning("NeMo Gym started off the main thread: no SIGTERM hook (atexit still stops it)")
        return
    previous = signal.getsignal(signal.SIGTERM)

    def _on_sigterm(signum: int, frame: Any) -> None:
        _kill_all()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # SIG_DFL, or a handler installed outside Python: terminate the way SIGTERM would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, _on_sigterm)
