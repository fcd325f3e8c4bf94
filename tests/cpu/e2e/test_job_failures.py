# SPDX-License-Identifier: Apache-2.0
"""Faults injected into running training jobs, and what the user then sees on the console.

Each test starts a job as the demo runs its job (`python -m recipe.nemo_gym_demo.console SPEC.json`: the job file
written, then `python -m recipe.nemo_gym.launch run` on it: verl's real `main_ppo`, verl's vLLM rollout on vLLM's CPU
build, NeMo Gym 0.7's real servers with the uppercase_share environment), injects one fault, and asserts the exit
status and the console's last lines: they must name what failed and why, and the log file for the rest. After every
job nothing of it may be left: no process (found by a marker in the environment every process of the job inherits)
and no temporary folder of the run. A small job: one environment, 2 prompts x 2 samples, 8-token answers, no
validation. The launcher's own semantics as the console shows them (Ctrl-C, a trainer killed by a signal, a second
job refused on a folder in use, a finished run's last line) are tested against a stand-in that behaves like
`main_ppo` for the launcher (`tests/support/stand_in_trainer.py`); the plugin's own faults, against the real
trainer: bad rows here. The other faults are injected into training runs that other modules make anyway: a NeMo Gym
server killed in `test_slurm_training.py`'s real job (under Slurm); the policy server killed, with this console,
and the failure-neutral step (a failed episode changes no statistic), in `test_main_ppo.py`'s resumed run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from recipe.nemo_gym_demo.console import REPO_ROOT, JobSpec, spec_to_json
from recipe.nemo_gym_demo.data import UPPERCASE_ROWS, write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.helpers import kill_processes_with_env, processes_with_env
from tests.support.stand_in_trainer import FINISH_FILE_ENV, STEP_FILE_ENV

pytestmark = [pytest.mark.timeout(900), pytest.mark.integration]

MARKER = "NG_TEST_JOB_FAILURES"
UPPERCASE = "uppercase_share_simple_agent"
READY = " s: agents ["  # the manager's "NeMo Gym <version> ready in N s: agents [...]" line: training is next


def _rows(n: int) -> list[dict]:
    lines = [line for line in UPPERCASE_ROWS.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines[:n]]


@pytest.fixture(scope="module")
def environments_file(tmp_path_factory) -> Path:
    """uppercase_share alone, health-checked every 2 s (a dead server is seen within seconds)."""
    path = tmp_path_factory.mktemp("plugin") / "uppercase.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "nemo_gym": {
                    "config_paths": [
                        "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
                        "resources_servers/uppercase_share/configs/uppercase_share.yaml",
                    ]
                },
                "timeouts": {"health_check_interval_s": 2, "policy_health_timeout_s": 2},
            }
        )
    )
    return path


def _spec(tmp_path: Path, environments_file: Path, train: Path, *, steps: int = 1, out: Path | None = None) -> JobSpec:
    return JobSpec(
        out_dir=out or tmp_path / "job",
        model_dir=Path(tiny_qwen3_dir()),
        environments_file=environments_file,
        train_files=[train],
        val_files=[train],
        steps=steps,
        batch_size=2,
        n=2,
        prompt_length=256,
        response_length=8,
        val_before_train=False,
    )


class RunningJob:
    """The demo's console (and under it the launcher and the trainer) in a process of its own (its own process
    group, as a terminal's foreground job), its console collected line by line."""

    def __init__(self, spec: JobSpec, tag: str, env: dict[str, str] | None = None):
        self.spec = spec
        spec_file = spec.out_dir.parent / f"{tag}.spec.json"
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(spec_to_json(spec))
        env = {**os.environ, **(env or {}), MARKER: f"{spec.out_dir}:{tag}"}
        self.marker = env[MARKER]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recipe.nemo_gym_demo.console", str(spec_file)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_log(self, text: str, timeout_s: float = 400.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.spec.log_file.exists() and text in self.spec.log_file.read_text(errors="replace"):
                return
            assert self.proc.poll() is None, f"the job ended before {text!r}:\n" + "\n".join(self.lines)
            time.sleep(0.5)
        raise AssertionError(f"{text!r} not in {self.spec.log_file} within {timeout_s} s")

    def finish(self, timeout_s: float = 600.0) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return rc

    def console(self) -> str:
        return "\n".join(self.lines)

    def left_behind(self) -> list[str]:
        """Processes of this job still alive a few seconds after it ended (the launcher waits for its trainer's
        process group; NeMo Gym's servers stop with their watchdog)."""
        deadline = time.monotonic() + 20
        while (left := processes_with_env(MARKER, self.marker)) and time.monotonic() < deadline:
            time.sleep(0.5)
        return [" ".join(p.cmdline()[:4]) for p in left if p.is_running()]


def _job_temp_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("ngjob-*")}


def _left_job_temp_folders(before: set[str]) -> list[str]:
    """The `ngjob-*` folders made since `before` that no live process has as its TMPDIR: what a finished job left.
    A job the other worker runs meanwhile (a `--shuffle` order can put one beside this test) holds its own."""
    new = sorted(p for p in Path(tempfile.gettempdir()).glob("ngjob-*") if p.name not in before)
    return [p.name for p in new if not processes_with_env("TMPDIR", str(p))]


def _trainer_temp(job: RunningJob) -> Path:
    """The stand-in trainer's TMPDIR, as it printed it into the job's log."""
    (folder,) = re.findall(r"stand-in trainer: TMPDIR (\S+)$", job.spec.log_file.read_text(), re.M)
    return Path(folder)


def test_bad_rows_fail_before_verl_starts_a_worker_listing_every_one_with_file_and_line(tmp_path, environments_file):
    rows = [json.dumps(row) for row in _rows(32)]  # every row of uppercase_share's training file
    rows[6] = rows[6][:-5]  # line 7: cut short
    rows[11] = json.dumps({"agent_ref": {"name": UPPERCASE}})  # line 12: no responses_create_params
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(rows) + "\n")
    before = _job_temp_folders()
    job = RunningJob(_spec(tmp_path, environments_file, train), "bad-rows")
    assert job.finish() == 1, job.console()
    lines = job.lines
    assert not any(line.startswith("step ") for line in lines), job.console()  # nothing trained
    cause = lines[lines.index("launch: the trainer failed (exit status 1); its error, from the end of its output:") :]
    # verl's val_files is the same file: it is read once, and each bad row listed once (not once per sample).
    assert cause[1] == (
        f"launch:   DataFilesError: 2 of 32 rows in {train} cannot be trained on; nothing was trained. Fix or remove "
        "them:"
    ), job.console()
    assert cause[2].startswith(f"launch:     {train}:7: invalid JSON: ")
    assert cause[3] == f"launch:     {train}:12: row has no 'responses_create_params' object"
    assert cause[-1] == f"full log: {job.spec.log_file}"
    # Refused as verl built its dataset: no worker, vLLM server or NeMo Gym was started.
    log = job.spec.log_file.read_text(errors="replace")
    assert "TaskRunner" in log and "WorkerDict" not in log and "vLLMHttpServer" not in log, log[-3000:]
    assert job.left_behind() == []
    assert _left_job_temp_folders(before) == []


STAND_IN = "tests.support.stand_in_trainer"


def _stand_in_spec(tmp_path: Path, environments_file: Path) -> JobSpec:
    """The launcher's own semantics need no training: a process that behaves like `main_ppo` for the launcher (its
    own process group with a child, a file in its TMPDIR, the manager's ready line, verl's way of stopping on
    SIGINT) stands in for the trainer (`stand_in_trainer.py`)."""
    train = write_jsonl(_rows(8), tmp_path / "train.jsonl")
    return dataclasses.replace(_spec(tmp_path, environments_file, train, steps=4), trainer_module=STAND_IN)


def test_ctrl_c_stops_the_trainer_with_sigint_and_exits_130_in_one_line(tmp_path, environments_file):
    job = RunningJob(_stand_in_spec(tmp_path, environments_file), "ctrl-c")
    job.wait_for_log(READY)
    os.killpg(job.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the console's process group
    assert job.finish() == 130, job.console()
    assert "Traceback" not in job.console()
    assert job.lines[-4] == "launch: SIGINT received: SIGINT to the trainer, its group killed after 30 s"
    # The trainer itself got SIGINT and stopped within the grace period (no SIGKILL needed), and its child with it.
    assert job.lines[-3].startswith("launch: the trainer stopped ") and job.lines[-3].endswith(" s after SIGINT")
    assert job.lines[-2] == "launch: the job was stopped by SIGINT (exit status 130)"
    assert job.lines[-1] == f"full log: {job.spec.log_file}"
    assert job.left_behind() == []
    assert not _trainer_temp(job).exists()  # the run's temporary folder is removed


def test_a_step_verl_logs_is_on_the_console_while_the_trainer_goes_on_printing_nothing(tmp_path, environments_file):
    """verl prints a step's metrics before it writes them to the file the console reads (its console logger comes
    first), and the trainer's next line may be a whole batch later: the console shows the step from the file as it
    grows, not at the trainer's next line (in CI a step shown a batch late let `test_main_ppo`'s next step finish)."""
    step = tmp_path / "step"
    job = RunningJob(_stand_in_spec(tmp_path, environments_file), "step-shown", env={STEP_FILE_ENV: str(step)})
    job.wait_for_log(READY)
    step.touch()  # the stand-in logs step 1 to verl's metrics file, then prints nothing and waits
    line = "step 1 | reward stand_in_simple_agent=1.000"
    deadline = time.monotonic() + 60
    while line not in job.lines and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    shown_while_running = line in job.lines and job.proc.poll() is None
    os.killpg(job.proc.pid, signal.SIGINT)
    assert job.finish() == 130, job.console()
    assert shown_while_running, job.console()
    assert job.lines.count(line) == 1, job.console()
    assert job.left_behind() == []


def test_a_trainer_killed_by_a_signal_is_reported_as_that_signal(tmp_path, environments_file):
    job = RunningJob(_stand_in_spec(tmp_path, environments_file), "sigkill")
    job.wait_for_log(READY)
    assert kill_processes_with_env(MARKER, job.marker, STAND_IN), "no trainer process found"
    assert job.finish() == 137, job.console()
    assert job.lines[-2] == "launch: the trainer was killed by SIGKILL (exit status 137)", job.console()
    assert job.lines[-1] == f"full log: {job.spec.log_file}"
    assert job.left_behind() == []  # the killed trainer's child too: the launcher stops the whole group
    assert not _trainer_temp(job).exists()  # the run's temporary folder is removed


def test_a_tmpdir_too_long_for_rays_sockets_moves_the_jobs_temporary_folder_under_tmp(tmp_path, environments_file):
    long_temp = tmp_path / ("t" * 40)  # with Ray's session and socket names below it, past the 107-byte limit
    long_temp.mkdir()
    finish = tmp_path / "finish"
    finish.touch()  # the stand-in trainer logs one step and exits 0 at once
    env = {"TMPDIR": str(long_temp), FINISH_FILE_ENV: str(finish)}
    job = RunningJob(_stand_in_spec(tmp_path, environments_file), "long-tmpdir", env=env)
    assert job.finish(timeout_s=120) == 0, job.console()
    assert (
        f"launch: TMPDIR {long_temp} is too long for the Unix socket paths of Ray under it: the job's temporary folder "
        "goes under /tmp"
    ) in job.lines, job.console()
    trainer_temp = _trainer_temp(job)
    assert trainer_temp.parent == Path("/tmp") and trainer_temp.name.startswith("ngjob-")
    assert not trainer_temp.exists() and list(long_temp.iterdir()) == []
    assert job.left_behind() == []


def test_two_jobs_on_one_folder_the_second_refuses_at_once_and_the_first_trains(tmp_path, environments_file):
    finish = tmp_path / "finish"  # the stand-in trainer logs a step and exits 0 once this exists
    first = RunningJob(_stand_in_spec(tmp_path, environments_file), "first", env={FINISH_FILE_ENV: str(finish)})
    first.wait_for_log(READY)  # the trainer is up and writing its log
    written = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in first.spec.out_dir.glob("*.*")}
    started = time.monotonic()
    second = RunningJob(first.spec, "second")
    assert second.finish(timeout_s=120) == 1
    refused_in = time.monotonic() - started
    assert second.lines[-1] == (
        f"job: {first.spec.out_dir} is in use by another job (PID {first.proc.pid}); wait for it to end, stop it, "
        "or give this job another output folder"
    ), second.console()
    assert refused_in < 60, refused_in  # before any trainer start-up
    for name, digest in written.items():  # the job file and the environments file are the first job's still
        if name != "main_ppo.log":
            assert hashlib.sha256((first.spec.out_dir / name).read_bytes()).hexdigest() == digest, name
    assert first.proc.poll() is None  # the refusal did not touch the running job
    finish.touch()
    assert first.finish(timeout_s=120) == 0, first.console()
    assert "step 1 | reward stand_in_simple_agent=1.000" in first.lines, first.console()
    assert first.lines[-2] == "launch: training finished", first.console()
    assert first.lines[-1].startswith("main_ppo finished in "), first.console()
    assert first.lines[-1].endswith(f" s; metrics: {first.spec.metrics_file}; log: {first.spec.log_file}")
    assert "is in use by another job" not in first.spec.log_file.read_text()  # the refusal wrote nothing there
    assert first.left_behind() == []
