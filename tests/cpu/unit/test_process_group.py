# SPDX-License-Identifier: Apache-2.0
"""`recipe/nemo_gym/process_group.py` on real process groups of `sleep`: a group that stops when asked, one that
ignores the signal and is killed after its grace, one already gone; zombies left out of the live members.

Every process of a group here is a child of the test (the first leads the group, the others join it), so the test
reaps them all and leaves no orphan behind (PID 1 of a container may never reap one)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from recipe.nemo_gym.process_group import live_members, signal_group, stop_group

SLEEPER = ["sleep", "60"]
# An ignored signal stays ignored across exec: this `sleep` ignores SIGTERM.
DEAF_SLEEPER = ["sh", "-c", "trap '' TERM; exec sleep 60"]


def _runs_sleep(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
    except OSError:
        return False


@pytest.fixture
def group():
    """`group(command, size)`: `size` processes running `command` in one new process group, the first its leader."""
    started: list[subprocess.Popen] = []

    def start(command: list[str], size: int = 2) -> list[subprocess.Popen]:
        # A group of its own in this session (joining a group of another session is not allowed).
        leader = subprocess.Popen(command, process_group=0)
        started.append(leader)
        started.extend(subprocess.Popen(command, process_group=leader.pid) for _ in range(size - 1))
        deadline = time.monotonic() + 10
        # Every member runs `sleep` (a `sh` has exec'd it, so its trap is in place): a signal sent earlier could
        # reach a `sh` that has not set its trap yet.
        while len(members := live_members(leader.pid)) < size or not all(_runs_sleep(pid) for pid in members):
            assert time.monotonic() < deadline, f"the group's {size} processes did not start"
            time.sleep(0.02)
        return started[-size:]

    yield start
    for proc in started:
        signal_group(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_a_group_that_stops_when_asked_is_gone_within_its_grace(group) -> None:
    procs = group(SLEEPER)
    pgid = procs[0].pid
    assert sorted(live_members(pgid)) == sorted(p.pid for p in procs)
    t0 = time.monotonic()
    assert stop_group(pgid, grace_s=10.0) == []
    assert time.monotonic() - t0 < 5.0
    assert [p.wait(timeout=5) for p in procs] == [-signal.SIGTERM] * 2
    assert live_members(pgid, with_zombies=True) == []


def test_a_group_that_ignores_the_signal_is_killed_after_its_grace(group) -> None:
    procs = group(DEAF_SLEEPER)
    t0 = time.monotonic()
    assert stop_group(procs[0].pid, grace_s=0.5) == []
    assert 0.5 <= time.monotonic() - t0 < 5.0
    assert [p.wait(timeout=5) for p in procs] == [-signal.SIGKILL] * 2


def test_without_a_first_signal_the_group_is_only_waited_for_then_killed(group) -> None:
    procs = group(SLEEPER)
    t0 = time.monotonic()
    assert stop_group(procs[0].pid, grace_s=0.3, first=None) == []
    assert time.monotonic() - t0 >= 0.3
    assert [p.wait(timeout=5) for p in procs] == [-signal.SIGKILL] * 2


def test_a_zombie_is_not_a_live_member_and_a_gone_group_is_not_an_error(group) -> None:
    (proc,) = group(SLEEPER, size=1)
    signal_group(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while live_members(proc.pid):  # our child is a zombie until we reap it
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert live_members(proc.pid, with_zombies=True) == [proc.pid]
    proc.wait()
    signal_group(proc.pid, signal.SIGTERM)
    assert stop_group(proc.pid, grace_s=0.1) == []
