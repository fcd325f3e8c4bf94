# SPDX-License-Identifier: Apache-2.0
"""`recipe/nemo_gym/launch/supervise.py` against real child processes that behave like a trainer (not a full
`main_ppo`: these are the supervisor's own semantics): its exit status passed on, its error shown last, what it
leaves in its process group stopped, and a signal to the launcher forwarded as verl's SIGINT, with a bounded grace.

A stopped launcher is a real `python -c` process here, since its signal handlers must be those of a main thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from recipe.nemo_gym.launch.supervise import exit_status, run_trainer
from tests.support.helpers import REPO_ROOT

FAILING_TRAINER = """
import traceback
print("step:1 - loss:0.5", flush=True)
try:
    raise RuntimeError("the cause a user must see")
except RuntimeError:
    traceback.print_exc()
raise SystemExit(3)
"""

# Leaves a child in its process group, writes the child's pid, and exits at once.
LEAVING_TRAINER = """
import subprocess, sys
child = subprocess.Popen(["sleep", "300"])
open(sys.argv[1], "w").write(str(child.pid))
"""

# Writes "ready", then on SIGINT writes "sigint" and exits 1 (as verl's driver does), unless told to ignore it.
STOPPABLE_TRAINER = """
import signal, sys, time
out = sys.argv[1]
def on_sigint(signum, frame):
    open(out, "a").write("sigint\\n")
    if sys.argv[2] != "ignore":
        raise SystemExit(1)
signal.signal(signal.SIGINT, on_sigint)
open(out, "a").write("ready\\n")
while True:
    time.sleep(0.1)
"""


# Stops only the way Python stops a program on SIGINT (KeyboardInterrupt), as verl's driver does: with SIGINT ignored
# from its parent, it would not stop at all.
INTERRUPTIBLE_TRAINER = """
import sys, time
out = sys.argv[1]
try:
    open(out, "a").write("ready\\n")
    while True:
        time.sleep(0.1)
except KeyboardInterrupt:
    open(out, "a").write("sigint\\n")
    raise SystemExit(1)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_trainers_status_is_the_jobs_and_its_error_ends_the_output(capfd):
    lines: list[str] = []
    status = run_trainer([sys.executable, "-c", FAILING_TRAINER], dict(os.environ), 5, write=lines.append)
    assert status == 3
    assert lines[0] == "step:1 - loss:0.5\n" and lines[-1] == "RuntimeError: the cause a user must see\n"
    err = capfd.readouterr().err.splitlines()
    assert err[-2:] == [
        "launch: the trainer failed (exit status 3); its error, from the end of its output:",
        "launch:   RuntimeError: the cause a user must see",
    ]


def test_a_trainer_that_passes_says_so_and_a_killed_one_reports_128_plus_the_signal(capfd):
    assert run_trainer([sys.executable, "-c", "pass"], dict(os.environ), 5, write=lambda line: None) == 0
    assert capfd.readouterr().err.splitlines()[-1] == "launch: training finished"
    killed = run_trainer(["sh", "-c", "kill -KILL $$"], dict(os.environ), 5, write=lambda line: None)
    assert killed == 137 and exit_status(-9, None) == 137 and exit_status(1, signal.SIGINT) == 130
    assert capfd.readouterr().err.splitlines()[-1] == "launch: the trainer was killed by SIGKILL (exit status 137)"


def test_what_the_trainer_leaves_in_its_process_group_is_stopped(tmp_path):
    pid_file = tmp_path / "child.pid"
    status = run_trainer([sys.executable, "-c", LEAVING_TRAINER, str(pid_file)], dict(os.environ), 5, lambda _: None)
    assert status == 0
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _launcher_with(
    tmp_path: Path, mode: str, grace_s: float, trainer: str = STOPPABLE_TRAINER, sigint_ignored: bool = False
) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "trainer.out"
    code = (
        "import os, sys\n"
        "from recipe.nemo_gym.launch.supervise import run_trainer\n"
        f"sys.exit(run_trainer([sys.executable, '-c', {trainer!r}, {str(out)!r}, {mode!r}], "
        f"dict(os.environ), {grace_s}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # What a background job of a non-interactive shell gets (ray_on_slurm.sh runs the launcher with `&`).
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True, preexec_fn=ignore
    )
    deadline = time.monotonic() + 30
    while not (out.exists() and "ready" in out.read_text()):
        assert launcher.poll() is None and time.monotonic() < deadline, "the trainer did not start"
        time.sleep(0.05)
    return launcher, out


def test_sigterm_to_the_launcher_reaches_the_trainer_as_sigint_and_the_job_exits_143(tmp_path):
    launcher, out = _launcher_with(tmp_path, "stop", grace_s=30)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 143, err
    assert out.read_text().splitlines() == ["ready", "sigint"]
    assert "launch: SIGTERM received: SIGINT to the trainer, its group killed after 30 s" in err
    assert [line for line in err.splitlines() if line.startswith("launch: the trainer stopped ")][0].endswith(
        " s after SIGINT"
    )
    assert err.splitlines()[-1] == "launch: the job was stopped by SIGTERM (exit status 143)"


def test_a_trainer_that_ignores_sigint_is_killed_after_the_grace(tmp_path):
    launcher, out = _launcher_with(tmp_path, "ignore", grace_s=1)
    started = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, err
    assert out.read_text().splitlines() == ["ready", "sigint"]
    assert time.monotonic() - started < 20
    assert "launch: the trainer did not stop within 1 s of SIGINT; its process group was killed" in err


def test_a_launcher_started_with_sigint_ignored_still_stops_its_trainer_with_sigint(tmp_path):
    launcher, out = _launcher_with(tmp_path, "stop", grace_s=30, trainer=INTERRUPTIBLE_TRAINER, sigint_ignored=True)
    launcher.send_signal(signal.SIGTERM)  # what the bootstrap's teardown sends
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 143, err
    assert out.read_text().splitlines() == ["ready", "sigint"]  # the trainer took SIGINT as KeyboardInterrupt
    assert "its process group was killed" not in err
