# SPDX-License-Identifier: Apache-2.0
"""A process outside the trainer that stops what it started when the trainer dies without a word: it kills NeMo Gym's
servers, or withdraws the policy address it published to an attached Gym.

Why: verl's TaskRunner is a Ray actor; when `main_ppo`'s driver exits, Ray sends the actor SIGTERM and SIGKILLs it
about 0.1 s later (Ray 2.60). When the SIGKILL comes before our SIGTERM hook has run (seen on loaded 2-core
machines), no code of ours runs in the trainer, and NeMo Gym's launcher, its servers and its own Ray (a session of
their own) live on indefinitely. Only a process that outlives the trainer can stop them.

Contract:
- `Watchdog.spawn()` starts `python -I <this file>`, which forks once more and lets its first process exit: the
  watchdog is no child of the trainer (Ray 2.60 SIGKILLs a worker's children when the worker exits, which would
  take a child watchdog along and orphan the servers, seen with verl's TaskRunner) and runs in a session of its
  own (a terminal's Ctrl-C does not reach it). It imports only the standard library and psutil, so it needs
  neither the recipe on `sys.path` nor a second of start-up. `spawn` returns once the watchdog reported its pid.
- It holds the read end of a pipe whose write end only the trainer holds. `register(pid)` sends a pid to watch;
  the watchdog also remembers every descendant of a watched process (once a second), so a server whose wrapper
  shell died first is still found. `register_session(sid)` watches every process of a session (NeMo Gym's
  launcher runs in a session of its own, so a process reparented to init is still found). `remove_on_exit(path)`
  names a folder to delete once those are killed (the run's private folder). `clear_on_exit(path, content)` names
  a file to empty if it still holds `content` (an attached Gym's endpoint file, still holding this trainer's
  address: `gym/attach.py` uses a watchdog for that alone).
- When the pipe closes, the watchdog SIGKILLs every watched process still alive, and every process of a watched
  session, deletes the folders it was given, empties the files it was given that still hold their content, and
  exits. The pipe closes when
  the trainer calls `release()` (after its own orderly shutdown: nothing is left, nothing is killed) or when the
  trainer dies in any way, SIGKILL included: the kernel closes its descriptors. `release(wait_s)` can wait for
  the watchdog to finish (a second pipe, which closes when the watchdog exits).

Python creates pipes non-inheritable, so no `exec`ed child of the trainer holds the write end; a child *forked*
without `exec` (a fork-started DataLoader worker) holds it until that child exits, which delays the kill by as
long.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys

import psutil


class Watchdog:
    """The trainer's side: the write end of the watch pipe, and the read end of the pipe that closes when the
    watchdog exits."""

    def __init__(self, pid: int, write_fd: int, done_fd: int):
        self.pid = pid
        self._write_fd: int | None = write_fd
        self._done_fd: int | None = done_fd

    @classmethod
    def spawn(cls, timeout_s: float = 30.0) -> Watchdog:
        read_fd, write_fd = os.pipe()
        done_read, done_write = os.pipe()
        try:
            subprocess.run(  # the launcher forks the watchdog and exits at once
                [sys.executable, "-I", os.path.abspath(__file__), str(read_fd), str(done_write)],
                pass_fds=(read_fd, done_write),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                check=True,
                timeout=timeout_s,
            )
            ready, _, _ = select.select([done_read], [], [], timeout_s)
            line = os.read(done_read, 64) if ready else b""
            if not line.strip().isdigit():
                # Imported here, in the trainer: the watchdog runs this file alone (`python -I`), stdlib and psutil.
                from recipe.nemo_gym.errors import ServerError

                raise ServerError(f"NeMo Gym server watchdog did not start within {timeout_s:g} s")
        except BaseException:
            os.close(write_fd)
            os.close(done_read)
            raise
        finally:
            os.close(read_fd)
            os.close(done_write)
        return cls(int(line), write_fd, done_read)

    def register(self, pid: int) -> None:
        """Watch `pid` (and its descendants). A watchdog that already exited is not an error: the caller's own
        shutdown still runs."""
        if self._write_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_fd, f"{pid}\n".encode())

    def register_session(self, sid: int) -> None:
        """Watch every process whose session id is `sid`."""
        if self._write_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_fd, f"s{sid}\n".encode())

    def remove_on_exit(self, path: str) -> None:
        """Delete the folder `path` after the kill (a path holds no newline: the pipe is line by line)."""
        if self._write_fd is None or "\n" in path:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_fd, f"r{path}\n".encode())

    def clear_on_exit(self, path: str, content: str) -> None:
        """After the kill, empty the file `path` if it still holds `content` (stripped): an attached Gym's endpoint
        file, so that a trainer that died without a word does not leave its dead address published."""
        if self._write_fd is None or "\n" in path + content or "\0" in path + content:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_fd, f"u{path}\0{content}\n".encode())

    def release(self, wait_s: float = 0.0) -> None:
        """Close the pipe: the watchdog kills what is still alive of the watched processes, then exits (within
        milliseconds). With `wait_s`, wait up to that long for it to exit. Idempotent."""
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        done, self._done_fd = self._done_fd, None
        if done is not None:
            with contextlib.suppress(OSError):
                if wait_s > 0 and select.select([done], [], [], wait_s)[0]:
                    os.read(done, 64)  # b"": the watchdog exited, its end of the pipe closed
                os.close(done)


def watch(read_fd: int, poll_s: float = 1.0) -> None:
    """The watchdog's loop: read pids until the pipe closes, then SIGKILL every watched process still alive."""
    watched: dict[int, psutil.Process] = {}
    sessions: set[int] = set()
    folders: list[str] = []
    to_clear: list[tuple[str, str]] = []
    pending = b""
    while True:
        readable, _, _ = select.select([read_fd], [], [], poll_s)
        if readable:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"s"):
                    sessions.add(int(line[1:]))
                    continue
                if line.startswith(b"r"):
                    folders.append(os.fsdecode(line[1:]))
                    continue
                if line.startswith(b"u"):
                    path, content = line[1:].split(b"\0", 1)
                    to_clear.append((os.fsdecode(path), content.decode()))
                    continue
                _remember(watched, int(line))
        _add_descendants(watched)
    _add_descendants(watched)
    for proc in session_members(sessions):
        _remember(watched, proc.pid)
    for proc in watched.values():
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                proc.kill()
    if folders:
        psutil.wait_procs(list(watched.values()), timeout=5.0)  # nothing writes into them any more
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    for path, content in to_clear:
        clear_if_holding(path, content)


def clear_if_holding(path: str, content: str) -> None:
    """Empty `path`, whole (a reader sees the old content or none), if it holds `content`; never raise. A file a
    later writer changed (the next trainer's address) is left alone."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(path) as current:
            if current.read().strip() != content:
                return
        staged = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.watchdog-{os.getpid()}")
        with open(staged, "w") as out:
            out.write("\n")
        os.replace(staged, path)


def session_members(sessions: set[int]) -> list[psutil.Process]:
    """Every live process whose session id is in `sessions`."""
    members = []
    if not sessions:
        return members
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(pid) in sessions:
                members.append(psutil.Process(pid))
    return members


def _remember(watched: dict[int, psutil.Process], pid: int) -> None:
    """Watch `pid`, unless it is watched already; a `psutil.Process` (a read of /proc) only for a new process."""
    known = watched.get(pid)
    if known is None or not _is_running(known):  # new, or a pid reused by a new process: watch the new one
        with contextlib.suppress(psutil.Error):
            watched[pid] = psutil.Process(pid)


def _add_descendants(watched: dict[int, psutil.Process]) -> None:
    """Remember every live descendant of a watched process, from one pass over the process table. (psutil's
    `children(recursive=True)` reads the whole table on each call: once per watched server every second, that was
    17% of a core with 20 watched servers among 400 processes on the 2-core test machine, psutil 7.)"""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parent_pids().items():
        children.setdefault(ppid, []).append(pid)
    # A watched process that exited may have had its pid reused: only live ones (same start time) are expanded.
    frontier = [pid for pid, proc in watched.items() if _is_running(proc)]
    seen = set(frontier)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in seen:
                seen.add(child)
                _remember(watched, child)
                frontier.append(child)


def _parent_pids() -> dict[int, int]:
    """Every process's parent pid, read from /proc/<pid>/stat (Linux). Measured here: 1.9 ms for 108 processes, where
    psutil's `process_iter` took 15.7 ms; it runs once a second, on nodes of thousands of processes."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                line = stat.read()
        except OSError:  # exited since the listing
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")". The same
        # parse as `recipe/nemo_gym/process_group.live_members`; not imported from there, because this module runs
        # standalone (`python -I`, the plugin's package not importable) so that it outlives the trainer.
        parents[int(name)] = int(line[line.rindex(b")") + 2 :].split(maxsplit=2)[1])
    return parents


def _is_running(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.is_running()
    return False


def main(read_fd: int, done_fd: int) -> None:
    """The watchdog process: detach from the trainer (fork; the first process exits), report the pid, watch."""
    if os.fork() > 0:
        os._exit(0)
    os.write(done_fd, f"{os.getpid()}\n".encode())
    watch(read_fd)  # done_fd closes when this process exits


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
