# SPDX-License-Identifier: Apache-2.0
"""A finished job removes the vLLM/verl files it left in /dev/shm and /tmp, and nothing another process holds."""

from __future__ import annotations

import mmap
import time
from pathlib import Path

from recipe.nemo_gym.leftovers import Candidate, orphans, remove_leftovers


def test_orphans_are_the_new_files_no_process_holds():
    candidates = [
        Candidate("/dev/shm/psm_new", created=100.0),
        Candidate("/dev/shm/psm_held", created=100.0),
        Candidate("/dev/shm/psm_old", created=99.0),
        Candidate("/tmp/rl-colocate-zmq-1.sock", created=150.0),
    ]
    held = {"/dev/shm/psm_held"}
    assert orphans(candidates, held, since=100.0) == ["/dev/shm/psm_new", "/tmp/rl-colocate-zmq-1.sock"]
    assert orphans(candidates, held, since=100.0, until=120.0) == ["/dev/shm/psm_new"]


def _segment(name: str) -> Path:
    """A POSIX shared-memory segment as Python's `multiprocessing.shared_memory` makes one: a file in /dev/shm."""
    path = Path("/dev/shm") / name
    path.write_bytes(b"\0" * 4096)
    return path


def test_remove_leftovers_takes_a_dropped_segment_and_keeps_a_mapped_one_and_an_older_one():
    tag = f"{time.time_ns()}"
    older = _segment(f"psm_test_old_{tag}")
    time.sleep(1.1)  # ctime has one-second resolution on some filesystems
    since = time.time() - 0.5
    dropped = _segment(f"psm_test_dropped_{tag}")  # unmapped, not unlinked: what an exited vLLM process leaves
    mapped = _segment(f"psm_test_mapped_{tag}")
    with open(mapped, "r+b") as handle, mmap.mmap(handle.fileno(), 4096):
        try:
            removed = remove_leftovers(since)
            assert str(dropped) in removed and not dropped.exists()
            assert mapped.exists() and older.exists()
        finally:
            mapped.unlink()
            older.unlink()
            dropped.unlink(missing_ok=True)
