# SPDX-License-Identifier: Apache-2.0
"""Remove what a finished job's vLLM and verl processes left in `/dev/shm` and `/tmp`, and nothing else.

vLLM 0.24 and verl 0.9.1 leave files behind after their processes are gone, on a clean exit too: vLLM's
shared-memory ring buffers (`/dev/shm/psm_*`, about 400 MB per run on CPU), verl's weight-transfer buckets
(`/dev/shm/verl_*`), the `multiprocessing` semaphores of vLLM's engine processes (`/dev/shm/sem.loky-*`: loky renames
them; left when the processes are killed) and verl's colocated ZeroMQ sockets (`/tmp/rl-colocate-zmq-*.sock`, after a
killed run). Nothing of theirs removes them later; on a long-lived node they accumulate across jobs until `/dev/shm`
is full.

A job removes its own: a file of those kinds, created after the job started (`since`, a wall-clock time taken
before the job's first process), that no live process holds open or mapped, or listens on. A file held by a running
process, another job's included, is never touched, and neither is one older than the job. The selection (`orphans`)
is a pure function; `held_files` and `remove_leftovers` are the glue that reads `/proc` and the folders.

"Held" is decided by file identity (device and inode), not by path: glibc's `sem_open` creates a semaphore under a
temporary name, maps it, then links it to `sem.<name>` and unlinks the temporary name, so `/proc/<pid>/maps` of the
process using `/dev/shm/sem.loky-1-x` shows `/dev/shm/sem.Ab12Cd (deleted)` with the same inode. (loky, imported in
vLLM's processes, renames every `multiprocessing` semaphore to `loky-*`; vLLM's EngineCore creates one for each
worker it spawns, which the worker opens a few seconds later.) Matching by path took such a live semaphore for an
orphan, and another job's clean-up removed it under an engine that was starting. A listening Unix socket's file is
held by path: its descriptor is a socket, not the file (`/proc/net/unix` lists the bound paths).

    python -m recipe.nemo_gym.launch.leftovers SINCE_EPOCH_SECONDS     # the submit scripts' teardown runs this
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


FileId = tuple[int, int]
"""(st_dev, st_ino): what a file is, whatever names it has or had."""


@dataclass(frozen=True)
class Candidate:
    path: str
    created: float
    """The file's change time (st_ctime), seconds since the epoch."""
    file_id: FileId


@dataclass(frozen=True)
class Held:
    """What live processes hold: files open or mapped (by identity), and the paths of bound Unix sockets."""

    files: frozenset[FileId] = frozenset()
    socket_paths: frozenset[str] = frozenset()


def orphans(candidates: Iterable[Candidate], held: Held, since: float, until: float = float("inf")) -> list[str]:
    """The candidates created from `since` to `until` that no process holds, sorted by path."""
    return sorted(
        c.path
        for c in candidates
        if since <= c.created <= until and c.file_id not in held.files and c.path not in held.socket_paths
    )


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
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            found.append(Candidate(path, st.st_ctime, (st.st_dev, st.st_ino)))
    return found


def maps_file_ids(maps_text: str) -> set[FileId]:
    """The files a `/proc/<pid>/maps` text maps: (device, inode) of each line with an inode (anonymous maps have 0)."""
    ids = set()
    for line in maps_text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) >= 5 and parts[4] != "0":
            major, minor = parts[3].split(":")
            ids.add((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])))
    return ids


def unix_socket_paths(net_unix_text: str) -> set[str]:
    """The filesystem paths of bound Unix sockets in a `/proc/net/unix` text (abstract ones start with '@')."""
    paths = set()
    for line in net_unix_text.splitlines()[1:]:
        parts = line.split()
        if len(parts) == 8 and parts[7].startswith("/"):
            paths.add(parts[7])
    return paths


def held_files() -> Held:
    """What every live process holds (open descriptors, memory maps) and the bound Unix sockets' paths; processes
    that vanish or cannot be read are skipped."""
    files: set[FileId] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        proc = Path("/proc", pid)
        try:
            for fd in os.listdir(proc / "fd"):
                try:
                    st = os.stat(proc / "fd" / fd)  # follows the descriptor to its file, deleted names included
                except OSError:
                    continue
                files.add((st.st_dev, st.st_ino))
            files |= maps_file_ids((proc / "maps").read_text())
        except OSError:
            continue
    try:
        sockets = unix_socket_paths(Path("/proc/net/unix").read_text())
    except OSError:
        sockets = set()
    return Held(frozenset(files), frozenset(sockets))


def remove_leftovers(since: float, patterns=PATTERNS) -> list[str]:
    """Remove this job's orphaned vLLM/verl files (see the module docstring); returns the paths removed."""
    removed = []
    for path in orphans(candidates(patterns), held_files(), since):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            continue
    return removed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m recipe.nemo_gym.launch.leftovers SINCE_EPOCH_SECONDS", file=sys.stderr)
        return 2
    removed = remove_leftovers(float(argv[0]))
    if removed:
        print(f"removed {len(removed)} file(s) vLLM/verl left behind: {', '.join(removed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
