# SPDX-License-Identifier: Apache-2.0
"""Stopping a process group: ask with a signal, wait a bounded grace, SIGKILL what is left, confirm that nothing is.

The one way the plugin and its test support stop a group they started (`start_new_session=True`, so the group's id
is its leader's pid): Gym's launcher (`gym/owned/processes.py`), the job launcher's trainer
(`launch/supervise.py`), and in the tests the CPU policy server (`tests/support/cpu_policy/`), the Gym started
outside the trainer (`tests/support/external_gym.py`) and the shared engine's host (`tests/support/engine/`).

Contract (Linux: the group is read from `/proc`):
- `live_members(pgid)`: the pids in the group that are not zombies. A zombie holds no memory, port or file; it waits
  for its parent to reap it, and a member whose parent is not the caller is reaped by its own parent.
  `live_members(pgid, with_zombies=True)` counts them too (a test that checks that every member was reaped).
- `signal_group(pgid, sig)`: sends `sig` to the group; a group that is gone is not an error.
- `stop_group(pgid, grace_s, first=SIGTERM, kill_wait_s=5.0)`: sends `first` (None: none, for a group that was
  already asked some other way), waits until no live member is left for at most `grace_s`, then SIGKILLs the group
  and waits at most `kill_wait_s` more. Returns the pids still alive after that (empty: the group is gone). Bounded:
  it returns within `grace_s + kill_wait_s` plus one poll.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

_POLL_S = 0.1


def live_members(pgid: int, with_zombies: bool = False) -> list[int]:
    """The pids whose process group is `pgid` and that are not zombies (unless `with_zombies`)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # ended while we looked
            continue
        # After the parenthesised command name (which may hold spaces and parentheses): state, ppid, pgrp, ...
        state, _, group = stat.rsplit(")", 1)[1].split()[:3]
        if int(group) == pgid and (with_zombies or state != "Z"):
            members.append(int(entry.name))
    return members


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def wait_until_gone(pgid: int, timeout_s: float) -> bool:
    """True once the group has no live member; False if some member is still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while live_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def stop_group(
    pgid: int, grace_s: float, first: signal.Signals | None = signal.SIGTERM, kill_wait_s: float = 5.0
) -> list[int]:
    """Ask the group to stop with `first`, SIGKILL it after `grace_s`; the pids that outlived both (see above)."""
    if first is not None:
        signal_group(pgid, first)
    if wait_until_gone(pgid, grace_s):
        return []
    signal_group(pgid, signal.SIGKILL)
    wait_until_gone(pgid, kill_wait_s)
    return live_members(pgid)
