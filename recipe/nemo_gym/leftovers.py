# SPDX-License-Identifier: Apache-2.0
"""Remove what a finished job's vLLM and verl processes left in `/dev/shm` and `/tmp`, and nothing else.

vLLM 0.24 and verl 0.9.1 leave files behind after their processes are gone, on a clean exit too: vLLM's
shared-memory ring buffers (`/dev/shm/psm_*`, about 400 MB per run on CPU), verl's weight-transfer buckets
(`/dev/shm/verl_*`), the semaphores of joblib's loky pool that vLLM's engine processes create
(`/dev/shm/sem.loky-*`, when they are killed) and verl's colocated ZeroMQ sockets (`/tmp/rl-colocate-zmq-*.sock`, after
a killed run). Nothing
of theirs removes them later; on a long-lived node they accumulate across jobs until `/dev/shm` is full.

A job removes its own: a file of those kinds, created after the job started (`since`, a wall-clock time taken
before the job's first process), that no live process holds open or mapped (read from `/proc/*/fd` and
`/proc/*/maps`). A file held by a running process, another job's included, is never touched, and neither is one
older than the job. The selection (`orphans`) is a pure function; `remove_leftovers` is the glue that reads `/proc`
and the folders.

    python -m recipe.nemo_gym.leftovers SINCE_EPOCH_SECONDS     # the submit scripts' teardown runs this
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PATTERNS = (
    ("/dev/shm", "psm_*"),
    ("/dev/shm", "verl_*"),
    ("/dev/shm", "sem.loky-*"),
    ("/tmp", "rl-colocate-zmq-*.sock"),
)


@dataclass(frozen=True)
class Candidate:
    path: str
    created: float
    """The file's change time (st_ctime), seconds since the epoch."""


def orphans(candidates: Iterable[Candidate], held: set[str], since: float, until: float = float("inf")) -> list[str]:
    """The candidates created from `since` to `until` that no process holds, sorted by path."""
    return sorted(c.path for c in candidates if since <= c.created <= until and c.path not in held)


def candidates(patterns=PATTERNS) -> list[Candidate]:
    found = []
    for folder, pattern in patterns:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in fnmatch.filter(names, pattern):
            path = os.path.join(folder, name)
            try:
                found.append(Candidate(path, os.lstat(path).st_ctime))
            except FileNotFoundError:
                continue
    return found


def held_paths() -> set[str]:
    """Every path some live process has open (fd) or mapped (maps); unreadable processes are skipped."""
    held: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        proc = Path("/proc", pid)
        try:
            for fd in os.listdir(proc / "fd"):
                try:
                    held.add(os.readlink(proc / "fd" / fd))
                except OSError:
                    continue
            with open(proc / "maps") as maps:
                for line in maps:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6:
                        held.add(parts[5].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            continue
    return held


def remove_leftovers(since: float) -> list[str]:
    """Remove this job's orphaned vLLM/verl files (see the module docstring); returns the paths removed."""
    removed = []
    for path in orphans(candidates(), held_paths(), since):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            continue
    return removed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m recipe.nemo_gym.leftovers SINCE_EPOCH_SECONDS", file=sys.stderr)
        return 2
    removed = remove_leftovers(float(argv[0]))
    if removed:
        print(f"removed {len(removed)} file(s) vLLM/verl left behind: {', '.join(removed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
