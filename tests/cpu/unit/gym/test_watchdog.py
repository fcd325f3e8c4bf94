# SPDX-License-Identifier: Apache-2.0
"""The watchdog (`recipe.nemo_gym.gym.watchdog`) kills a dead trainer's servers, and nothing else.

The "trainer" here is a child Python process that spawns the real watchdog, starts server-like processes (a
wrapper shell with children, as NeMo Gym's `RunHelper` starts each server) and registers them; the test then ends
it the way Ray ends verl's TaskRunner: SIGKILL to the trainer and to each of its children (Ray 2.60 kills a
worker's children as the worker exits), so no code of the trainer runs and the servers are orphaned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from recipe.nemo_gym.gym.watchdog import Watchdog, _parent_pids
from tests.support.helpers import REPO_ROOT, alive

TRAINER = r"""
import json, subprocess, sys, time
from recipe.nemo_gym.gym.watchdog import Watchdog

watchdog = Watchdog.spawn()
# A wrapper shell whose children are the "server" (as NeMo Gym's `( cmd ) | tee log` wrappers are).
wrapper = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300 & wait"])
watchdog.register(wrapper.pid)  # only the wrapper: the watchdog finds its descendants itself
time.sleep(0.5)
print(json.dumps({"watchdog": watchdog.pid, "wrapper": wrapper.pid}), flush=True)
time.sleep(300)
"""


def _children_of(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def test_trainer_and_its_children_sigkilled_as_ray_ends_a_worker_leave_no_watched_process():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True, env=env)
    servers: list[int] = []
    try:
        started = json.loads(trainer.stdout.readline())
        servers = _children_of(started["wrapper"])
        assert len(servers) == 2
        assert started["watchdog"] not in _children_of(trainer.pid)  # detached: Ray's kill of children spares it
        time.sleep(1.5)  # the watchdog looks for descendants once a second
        for child in psutil.Process(trainer.pid).children():  # the wrapper goes first: its children are orphaned
            child.kill()
        trainer.kill()  # no handler, no atexit: only the watchdog can act
        trainer.wait(timeout=10)
        assert _gone_within(servers, 10.0) == [], "the watchdog left a server of the dead trainer running"
        assert _gone_within([started["watchdog"]], 10.0) == [], "the watchdog did not exit after its work"
    finally:
        trainer.kill()
        for pid in alive(servers):
            os.kill(pid, signal.SIGKILL)


def test_release_after_an_orderly_stop_ends_the_watchdog_and_spares_unwatched_processes():
    watchdog = Watchdog.spawn()
    watched = subprocess.Popen(["sleep", "300"])
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        watchdog.register(watched.pid)
        watched.terminate()  # the owner's own shutdown
        watched.wait(timeout=10)
        watchdog.release(wait_s=10.0)
        assert _gone_within([watchdog.pid], 5.0) == []  # its pipe closes as it exits; the exit itself follows
        assert bystander.poll() is None, "the watchdog killed a process it was never given"
    finally:
        watchdog.release()
        for proc in (watched, bystander):
            proc.kill()
            proc.wait(timeout=10)


def test_release_kills_what_the_owner_could_not_stop():
    watchdog = Watchdog.spawn()
    stubborn = subprocess.Popen(["sleep", "300"])
    try:
        watchdog.register(stubborn.pid)
        watchdog.release(wait_s=10.0)  # as kill_now does when its own SIGKILLs were cut short
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait(timeout=10)


def test_a_file_still_holding_the_owners_content_is_emptied_and_one_rewritten_since_is_left(tmp_path):
    ours, rewritten = tmp_path / "endpoint", tmp_path / "endpoint_of_the_next_trainer"
    ours.write_text("http://10.0.0.1:8000/v1\n")
    rewritten.write_text("http://10.0.0.2:8000/v1\n")
    watchdog = Watchdog.spawn()
    try:
        watchdog.clear_on_exit(str(ours), "http://10.0.0.1:8000/v1")
        watchdog.clear_on_exit(str(rewritten), "http://10.0.0.1:8000/v1")  # the next trainer wrote its own since
        assert ours.read_text() == "http://10.0.0.1:8000/v1\n"  # nothing happens while the owner lives
    finally:
        watchdog.release(wait_s=10.0)  # as the owner's death closes the pipe
    assert ours.read_text().strip() == ""
    assert rewritten.read_text() == "http://10.0.0.2:8000/v1\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == [ours.name, rewritten.name]  # no staged file left


def test_parent_pids_reads_every_process_even_one_whose_name_holds_parentheses_and_spaces(tmp_path):
    # /proc/<pid>/stat is "pid (comm) state ppid ...", and a program's name is its comm: this one is "a) b (c".
    odd = tmp_path / "a) b (c"
    odd.write_bytes(Path("/bin/sleep").read_bytes())
    odd.chmod(0o755)
    child = subprocess.Popen([str(odd), "30"])
    try:
        time.sleep(0.2)
        parents = _parent_pids()
        assert parents[child.pid] == os.getpid()
        assert parents[os.getpid()] == os.getppid()
        assert psutil.Process(child.pid).name() == "a) b (c"
    finally:
        child.kill()
        child.wait()
