# SPDX-License-Identifier: Apache-2.0
"""The CPU job runner's console (verl's logged step metrics, the manager's progress lines, how a failed or stopped run
ended) and its hold on the output folder, as a user meets them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.nemo_gym_testing.cpu_training.job import (
    RAY_START_TIMEOUT,
    REPO_ROOT,
    JobResult,
    OutputFolderInUse,
    environments,
    format_step,
    hold_output_folder,
    missed_ray_start,
    outcome_lines,
    progress_text,
)

GYM = "timing_s/nemo_gym/"


def test_progress_line_loses_rays_process_tag_and_the_log_record_prefix():
    line = (
        "\x1b[36m(TaskRunner pid=20770)\x1b[0m WARNING:2026-11-23 16:18:43,651:NeMo Gym rollout: 14/14 episodes done\n"
    )
    assert progress_text(line) == "NeMo Gym rollout: 14/14 episodes done"
    assert progress_text("(pid=7, ip=10.0.0.1) NeMo Gym rollout: 1/2\n") == "NeMo Gym rollout: 1/2"


def test_training_step_line_shows_reward_per_environment_loss_failures_and_times():
    data = {
        f"{GYM}all/episodes": 8.0,
        f"{GYM}all/failed": 1.0,
        f"{GYM}math/episodes": 4.0,
        f"{GYM}math/reward/mean": 0.25,
        f"{GYM}uppercase/episodes": 4.0,
        f"{GYM}uppercase/reward/mean": 0.5,
        f"{GYM}rollout_wait": 21.64,
        f"{GYM}packing": 0.0042,
        "actor/pg_loss": -0.0123,
        "actor/grad_norm": 0.2071,
        "timing_s/step": 66.4,
    }
    assert environments(data) == ["math", "uppercase"]
    assert format_step({"step": 3, "data": data}) == (
        "step 3 | reward math=0.250 uppercase=0.500 | loss -0.0123 grad_norm 0.207 | failed 1/8"
        " | rollout 21.6s packing 4ms | step 66s"
    )


def test_validation_step_line_shows_the_validation_reward_per_environment():
    data = {"val-core/math/acc/mean@1": 0.0, "val-core/workplace/acc/mean@1": 1.0, "val-aux/math/reward/mean@1": 0.0}
    assert format_step({"step": 0, "data": data}) == "step 0 | validation math=0.000 workplace=1.000"


def test_only_a_run_that_failed_at_rays_start_up_deadline_is_run_again():
    log = f"Exception: {RAY_START_TIMEOUT}. This could happen because some of the raylet failed to startup\n"
    assert missed_ray_start(JobResult(returncode=1, elapsed_s=60.0), log)
    assert not missed_ray_start(JobResult(returncode=0, elapsed_s=60.0), log)
    assert not missed_ray_start(JobResult(returncode=1, elapsed_s=60.0), "ValueError: bad override\n")
    # once a step ran, a failure is the job's own: never run a training job twice
    assert not missed_ray_start(JobResult(returncode=1, elapsed_s=60.0, steps=[{"step": 1, "data": {}}]), log)


def test_a_failed_run_ends_with_its_cause_and_the_log():
    result = JobResult(returncode=1, elapsed_s=113.4, cause="RolloutAborted: server died\n  its log tail")
    assert outcome_lines(result, Path("/out/main_ppo.log")) == [
        "main_ppo failed with exit status 1 after 113 s:",
        "  RolloutAborted: server died",
        "    its log tail",
        "full log: /out/main_ppo.log",
    ]
    assert outcome_lines(JobResult(returncode=0, elapsed_s=5.0), Path("/l")) == []


def test_a_signal_is_reported_as_one_with_the_shells_exit_status():
    killed = JobResult(returncode=-9, elapsed_s=50.2)
    assert killed.exit_status == 137
    assert outcome_lines(killed, Path("/l")) == [
        "main_ppo was killed by SIGKILL after 50 s (exit status 137); the log shows no Python exception",
        "full log: /l",
    ]
    interrupted = JobResult(returncode=-2, elapsed_s=3.9, stopped_by=signal.SIGINT)
    assert interrupted.exit_status == 130
    assert outcome_lines(interrupted, Path("/l")) == ["main_ppo stopped by SIGINT after 4 s (exit status 130); log: /l"]
    assert JobResult(returncode=1, elapsed_s=1.0, stopped_by=signal.SIGTERM).exit_status == 143


def test_a_second_job_on_a_folder_in_use_is_refused_naming_the_first_jobs_pid(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from recipe.nemo_gym_testing.cpu_training.job import hold_output_folder\n"
            f"with hold_output_folder(Path({str(out)!r})):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputFolderInUse, match=rf"{out} is in use by another job \(PID {holder.pid}\)"):
            with hold_output_folder(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the lock with the process: the folder is free again, and re-entrant within a process.
    with hold_output_folder(out), hold_output_folder(out):
        assert (out / ".job.lock").read_text() == f"{os.getpid()}\n"


def test_a_job_spec_round_trips_through_json_and_relative_paths_become_absolute(tmp_path, monkeypatch):
    from recipe.nemo_gym_testing.cpu_training.job import JobSpec, spec_from_json, spec_to_json

    spec = JobSpec(
        out_dir=tmp_path / "out",
        model_dir=tmp_path / "model",
        agent_loop_config=tmp_path / "plugin.yaml",
        train_files=[tmp_path / "t.jsonl"],
        val_files=[tmp_path / "v.jsonl"],
        steps=2,
        batch_size=2,
        n=2,
        prompt_length=256,
        response_length=8,
        extra_overrides=("data.shuffle=false",),
    )
    assert spec_from_json(spec_to_json(spec)) == spec
    monkeypatch.chdir(tmp_path)
    relative = spec_from_json(spec_to_json(spec).replace(str(tmp_path) + "/", ""))
    assert relative == spec
