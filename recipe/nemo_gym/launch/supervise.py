# SPDX-License-Identifier: Apache-2.0
"""Run the trainer to its end and leave nothing behind: the one supervisor of a job's `main_ppo`.

`run_trainer(argv, env, stop_grace_s)` starts the trainer in a process group of its own and returns the job's exit
status once it has ended:
- its output goes on to this process's stdout line by line, and the last lines are kept in memory;
- SIGINT or SIGTERM to this process stops the trainer the way verl stops: SIGINT to the trainer (verl's driver
  stops its Ray job), then its whole group killed after `stop_grace_s`; the status is then 128 + the signal's
  number (130 for Ctrl-C), and so is that of a trainer killed by a signal;
- whatever of its process group outlives it (processes it started and did not stop) gets SIGTERM, `stop_grace_s`,
  then SIGKILL (`process_group.stop_group`);
- what vLLM and verl leave in `/dev/shm` and the temporary folder since the start, held by no process, is removed
  (`leftovers`);
- a failed trainer's error (`failure_cause`: the innermost exception of its last traceback, whichever process
  raised it) ends the output, so that it is not a thousand lines above. Under the Ray bootstrap, which stops Ray
  after the launcher, these last lines go to the file `$NG_OUTCOME_FILE` instead, and the bootstrap prints them last.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from recipe.nemo_gym.launch.failure_cause import failure_cause
from recipe.nemo_gym.launch.leftovers import remove_leftovers
from recipe.nemo_gym.process_group import signal_group, stop_group

TAIL_LINES = 5000
"""Lines of the trainer's output kept for `failure_cause`: enough for the longest traceback verl prints."""
PIPE_DRAIN_S = 10.0
"""How long the trainer's last output may take to arrive once its process group is gone."""


def _copy(pipe, write: Callable[[str], None], tail: collections.deque[str]) -> None:
    with contextlib.suppress(ValueError, OSError):  # the pipe closed under it
        for line in pipe:
            write(line)
            tail.append(line)


def say(message: str) -> None:
    """A line of the launcher's own, on stderr (the trainer's output is on stdout)."""
    print(f"launch: {message}", file=sys.stderr, flush=True)


def exit_status(returncode: int, stopped_by: int | None) -> int:
    """The status a shell reports: 128 + N for a signal N, whether it stopped this job or killed the trainer."""
    if stopped_by is not None:
        return 128 + stopped_by
    return 128 - returncode if returncode < 0 else returncode


def run_trainer(
    argv: Sequence[str],
    env: Mapping[str, str],
    stop_grace_s: float,
    write: Callable[[str], None] = sys.stdout.write,
    report: Callable[[str], None] | None = None,
) -> int:
    """Run `argv` as described in the module docstring; returns the job's exit status. `report` gets the outcome's
    lines (`outcome_lines`; default: this process's stderr, each after `launch: `)."""
    report = report or say
    started_at = time.time()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    stopped_by: list[int] = []
    stop_started: list[float] = []
    killed: list[bool] = []
    started: list[subprocess.Popen] = []  # the trainer, once started
    interrupted: list[bool] = []

    def kill_group() -> None:
        killed.append(True)
        signal_group(started[0].pid, signal.SIGKILL)

    kill_timer = threading.Timer(stop_grace_s, kill_group)
    kill_timer.daemon = True

    def interrupt() -> None:
        if interrupted:
            return
        interrupted.append(True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(started[0].pid, signal.SIGINT)
        with contextlib.suppress(RuntimeError):  # started already, by a handler that ran in between
            kill_timer.start()

    def on_signal(signum: int, frame: object) -> None:
        if stopped_by:
            return  # one stop at a time; it is bounded
        stopped_by.append(signum)
        stop_started.append(time.monotonic())
        name = signal.Signals(signum).name
        say(f"{name} received: SIGINT to the trainer, its group killed after {stop_grace_s:.0f} s")
        if started:
            interrupt()

    # The handlers go in before the trainer starts: a handled signal is reset to its default in the child, while an
    # ignored one stays ignored there, and this process may have SIGINT ignored (a background job of a
    # non-interactive shell, as under ray_on_slurm.sh; nohup): Python would then not turn SIGINT into
    # KeyboardInterrupt in the trainer, and verl's driver would never stop on it.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: what it leaves behind is found and stopped
        )
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    started.append(proc)
    if stopped_by:  # a signal arrived while it started
        interrupt()
    # The output is read by a thread: a process the trainer leaves behind may hold its pipe open long after the
    # trainer has exited, and the job ends with the trainer, not with the pipe.
    reader = threading.Thread(target=_copy, args=(proc.stdout, write, tail), daemon=True)
    reader.start()
    try:
        proc.wait()
        if killed:
            say(f"the trainer did not stop within {stop_grace_s:.0f} s of SIGINT; its process group was killed")
        elif stopped_by:
            say(f"the trainer stopped {time.monotonic() - stop_started[0]:.1f} s after SIGINT")
    finally:
        kill_timer.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        stop_group(proc.pid, stop_grace_s, first=signal.SIGTERM)
        reader.join(timeout=PIPE_DRAIN_S)
        for path in remove_leftovers(started_at):
            say(f"removed {path} (left by vLLM or verl, held by no process)")
    status = exit_status(proc.returncode, stopped_by[0] if stopped_by else None)
    cause = failure_cause("".join(tail)) if proc.returncode > 0 and not stopped_by else None
    killed_by = -proc.returncode if proc.returncode < 0 and not stopped_by else None
    for line in outcome_lines(status, stopped_by[0] if stopped_by else None, str(cause) if cause else None, killed_by):
        report(line)
    return status


def outcome_lines(status: int, stopped_by: int | None, cause: str | None, killed_by: int | None = None) -> list[str]:
    """How the job ended, as its output's last lines: the status, and a failed trainer's error (or the signal that
    killed it)."""
    if status == 0:
        return ["training finished"]
    if stopped_by is not None:
        return [f"the job was stopped by {signal.Signals(stopped_by).name} (exit status {status})"]
    if killed_by is not None:
        return [f"the trainer was killed by {signal.Signals(killed_by).name} (exit status {status})"]
    if cause is None:
        return [f"the trainer failed (exit status {status})"]
    lines = [f"the trainer failed (exit status {status}); its error, from the end of its output:"]
    return lines + [f"  {line}" for line in cause.splitlines()]
