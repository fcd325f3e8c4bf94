# SPDX-License-Identifier: Apache-2.0
"""A finished job removes the vLLM/verl files it left in /dev/shm and /tmp, and nothing another process holds."""

from __future__ import annotations

import mmap
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from recipe.nemo_gym.launch.leftovers import (
    Candidate,
    Held,
    maps_file_ids,
    orphans,
    remove_leftovers,
    unix_socket_paths,
)


def test_orphans_are_the_new_files_no_process_holds():
    candidates = [
        Candidate("/dev/shm/psm_new", created=100.0, file_id=(27, 1)),
        Candidate("/dev/shm/psm_held", created=100.0, file_id=(27, 2)),
        Candidate("/dev/shm/sem.loky-7-ab", created=100.0, file_id=(27, 3)),  # held under another (deleted) name
        Candidate("/dev/shm/psm_old", created=99.0, file_id=(27, 4)),
        Candidate("/tmp/rl-colocate-zmq-1.sock", created=150.0, file_id=(2049, 5)),
        Candidate("/tmp/rl-colocate-zmq-2.sock", created=150.0, file_id=(2049, 6)),  # a live listener's file
    ]
    held = Held(files=frozenset({(27, 2), (27, 3)}), socket_paths=frozenset({"/tmp/rl-colocate-zmq-2.sock"}))
    assert orphans(candidates, held, since=100.0) == ["/dev/shm/psm_new", "/tmp/rl-colocate-zmq-1.sock"]
    assert orphans(candidates, held, since=100.0, until=120.0) == ["/dev/shm/psm_new"]
    assert orphans(candidates, Held(), since=0.0) == sorted(c.path for c in candidates)


def test_maps_are_read_by_device_and_inode_whatever_the_name():
    maps = (
        "7fbece443000-7fbece444000 rw-s 00000000 00:1b 121                        /dev/shm/sem.N7XI0j (deleted)\n"
        "7fbece445000-7fbece446000 r--p 00000000 08:01 5512                       /usr/lib/libc.so.6\n"
        "7ffd1c9a5000-7ffd1c9c6000 rw-p 00000000 00:00 0                          [stack]\n"
        "7ffd1c9c7000-7ffd1c9c8000 rw-p 00000000 00:00 0\n"
    )
    assert maps_file_ids(maps) == {(os.makedev(0, 0x1B), 121), (os.makedev(8, 1), 5512)}


def test_bound_unix_socket_paths_are_read_from_proc_net_unix():
    text = (
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 31337 /tmp/rl-colocate-zmq-9.sock\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 31338 @/tmp/.X11-unix/X0\n"
        "0000000000000000: 00000003 00000000 00000000 0001 03 31339\n"
    )
    assert unix_socket_paths(text) == {"/tmp/rl-colocate-zmq-9.sock"}


def _segment(folder: Path, name: str) -> Path:
    """A POSIX shared-memory segment as Python's `multiprocessing.shared_memory` makes one: a file on /dev/shm's
    tmpfs."""
    path = folder / name
    path.write_bytes(b"\0" * 4096)
    return path


def test_remove_leftovers_takes_a_dropped_segment_and_keeps_a_mapped_one_and_an_older_one():
    # A folder of its own on /dev/shm's tmpfs: a job ending beside this test (another xdist worker) cleans the
    # top of /dev/shm from its own start, which would take this test's files too.
    folder = Path("/dev/shm") / f"ngtest-leftovers-{os.getpid()}-{time.time_ns()}"
    folder.mkdir()
    patterns = ((str(folder), "psm_*"),)
    try:
        older = _segment(folder, "psm_test_old")
        time.sleep(1.1)  # ctime has one-second resolution on some filesystems
        since = time.time() - 0.5
        dropped = _segment(folder, "psm_test_dropped")  # unmapped, not unlinked: what an exited vLLM process leaves
        mapped = _segment(folder, "psm_test_mapped")
        with open(mapped, "r+b") as handle, mmap.mmap(handle.fileno(), 4096):
            removed = remove_leftovers(since, patterns)
        assert removed == [str(dropped)] and not dropped.exists()
        assert mapped.exists() and older.exists()
    finally:
        shutil.rmtree(folder)


LIVE_SEMAPHORE = """
import os, sys, multiprocessing
import joblib.externals.loky.backend  # as in vLLM's processes: every multiprocessing semaphore is named loky-*
lock = multiprocessing.get_context("spawn").Lock()  # what vLLM's EngineCore makes for a worker it spawns
print(next(n for n in os.listdir("/dev/shm") if n.startswith(f"sem.loky-{os.getpid()}-")), flush=True)
sys.stdin.read()
"""


def test_a_live_semaphore_and_a_live_socket_created_after_the_job_started_are_kept(tmp_path):
    since = time.time() - 1.0
    # The socket in a folder of its own, for the reason of the test above; the semaphore is where loky makes it
    # (held, so no other job's clean-up takes it).
    patterns = (("/dev/shm", "sem.loky-*"), (str(tmp_path), "rl-colocate-zmq-*.sock"))
    child = subprocess.Popen(
        [sys.executable, "-c", LIVE_SEMAPHORE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    sock_path = tmp_path / "rl-colocate-zmq-test.sock"
    listener = socket.socket(socket.AF_UNIX)
    try:
        semaphore = Path("/dev/shm") / child.stdout.readline().strip()
        listener.bind(str(sock_path))
        listener.listen()
        assert semaphore.name.startswith("sem.loky-") and semaphore.exists()
        removed = remove_leftovers(since, patterns)
        assert str(semaphore) not in removed and semaphore.exists()
        assert str(sock_path) not in removed and sock_path.exists()
        listener.close()  # the file stays after the socket is gone: now it is litter
        assert str(sock_path) in remove_leftovers(since, patterns) and not sock_path.exists()
    finally:
        listener.close()
        sock_path.unlink(missing_ok=True)
        child.communicate(input="", timeout=30)
