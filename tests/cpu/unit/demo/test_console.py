# SPDX-License-Identifier: Apache-2.0
"""The demo's console (verl's logged step metrics, the manager's progress lines, a failed trainer's error from the
launcher's last lines), the job file it hands the launcher, and its hold on the output folder, as a user meets them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipe.nemo_gym.launch.job import load_job
from recipe.nemo_gym.ray_start import RAY_START_TIMEOUT
from recipe.nemo_gym_demo.console import (
    REPO_ROOT,
    STOP_GRACE_S,
    JobResult,
    JobSpec,
    OutputFolderInUse,
    hold_output_folder,
    launcher_command,
    trainer_missed_ray_start,
    write_job,
)
from recipe.nemo_gym_demo.view import StepFollower, environments, format_step, progress_text

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


def test_the_metrics_file_is_read_as_it_grows_each_step_once_and_a_half_written_line_later(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    follower = StepFollower(metrics)
    assert follower.new_steps() == []  # verl has not created it yet
    with open(metrics, "wb", buffering=0) as f:  # as verl's file logger writes it
        f.write(b'{"step": 0, "data": {"val": 1}}\n{"step": 1, "da')
        assert follower.new_steps() == [{"step": 0, "data": {"val": 1}}]
        assert follower.new_steps() == []
        f.write(b'ta": {"x": 2}}\n')
        assert follower.new_steps() == [{"step": 1, "data": {"x": 2}}]
        f.write(b'{"step": 2, "data": {}}\n{"step": 3, "data": {}}\n')
        assert [s["step"] for s in follower.new_steps()] == [2, 3]
    assert [s["step"] for s in follower.read] == [0, 1, 2, 3]  # every step read, once: the run's result


def test_only_a_run_that_failed_at_rays_start_up_deadline_is_run_again():
    log = f"Exception: {RAY_START_TIMEOUT}. This could happen because some of the raylet failed to startup\n"
    assert trainer_missed_ray_start(JobResult(exit_status=1, elapsed_s=60.0), log)
    assert not trainer_missed_ray_start(JobResult(exit_status=0, elapsed_s=60.0), log)
    assert not trainer_missed_ray_start(JobResult(exit_status=130, elapsed_s=60.0), log)  # stopped: never started again
    assert not trainer_missed_ray_start(JobResult(exit_status=1, elapsed_s=60.0), "ValueError: bad override\n")
    # once a step ran, a failure is the job's own: never run a training job twice
    assert not trainer_missed_ray_start(JobResult(exit_status=1, elapsed_s=60.0, steps=[{"step": 1, "data": {}}]), log)


def test_a_failed_trainers_error_is_read_from_the_launchers_last_lines():
    outcome = [
        "launch: starting the trainer (job, backend cpu) against Ray at its own",
        "launch: the trainer failed (exit status 1); its error, from the end of its output:",
        "launch:   RolloutAborted: server died",
        "launch:     its log tail",
    ]
    assert (
        JobResult(exit_status=1, elapsed_s=1.0, outcome=outcome).cause
        == "  RolloutAborted: server died\n    its log tail"
    )
    stopped = ["launch: the job was stopped by SIGINT (exit status 130)"]
    assert JobResult(exit_status=130, elapsed_s=1.0, outcome=stopped).cause is None


def _spec(tmp_path: Path, **keys) -> JobSpec:
    plugin = tmp_path / "plugin.yaml"
    plugin.write_text("nemo_gym:\n  config_paths: [resources_servers/math_with_judge/configs/math_with_judge.yaml]\n")
    keys = {
        "out_dir": tmp_path / "out",
        "model_dir": tmp_path / "model",
        "environments_file": plugin,
        "train_files": [tmp_path / "t.jsonl"],
        "val_files": [tmp_path / "v.jsonl"],
        "steps": 3,
        "batch_size": 4,
        "n": 2,
        "prompt_length": 256,
        "response_length": 8,
        **keys,
    }
    return JobSpec(**keys)


def test_the_written_job_is_a_valid_launcher_job_with_the_specs_sizes_and_the_logs_in_the_output_folder(tmp_path):
    spec = _spec(tmp_path, head_port=12345, resume=True, extra_overrides=("data.shuffle=false",))
    job = load_job(write_job(spec), environ={})
    assert (job.backend, job.model, job.checkpoint_dir) == ("cpu", tmp_path / "model", tmp_path / "out" / "checkpoints")
    assert job.data.train_files == [tmp_path / "t.jsonl"] and job.data.val_files == [tmp_path / "v.jsonl"]
    t = job.training
    assert (t.train_batch_size, t.ppo_mini_batch_size, t.rollout_n, t.total_training_steps) == (4, 4, 2, 3)
    assert (t.max_prompt_length, t.max_response_length, t.micro_batch_size_per_gpu) == (256, 8, 1)
    assert (job.cluster.gpus_per_node, job.cluster.stop_grace_s) == (1, STOP_GRACE_S)
    assert job.logging.loggers == ["console", "file"] and job.experiment == "out"
    assert job.verl_overrides[-3:] == [
        "trainer.resume_mode=auto",
        f"hydra.run.dir={tmp_path / 'out' / 'hydra'}",
        "data.shuffle=false",
    ]
    # NeMo Gym's servers log into the output folder and listen on the spec's port
    plugin = yaml.safe_load(job.environments.read_text())
    assert job.environments == tmp_path / "out" / "environments.yaml"
    assert plugin["nemo_gym"]["log_dir"] == str(spec.nemo_gym_log_dir)
    assert plugin["nemo_gym"]["head_server"] == {"host": "127.0.0.1", "port": 12345}


def test_an_attached_gym_keeps_its_own_logs_and_port(tmp_path):
    spec = _spec(tmp_path)
    spec.environments_file.write_text("nemo_gym:\n  attach:\n    head_server_url: http://10.0.0.1:11000\n")
    plugin = yaml.safe_load(load_job(write_job(spec), environ={}).environments.read_text())
    assert plugin == {"nemo_gym": {"attach": {"head_server_url": "http://10.0.0.1:11000"}}}


def test_the_launcher_runs_the_job_file_with_the_metrics_file_and_only_a_stand_in_named_for_it(tmp_path):
    argv, env = launcher_command(_spec(tmp_path))
    assert argv[1:] == ["-m", "recipe.nemo_gym.launch", "run", str(tmp_path / "out" / "job.yaml")]
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "out" / "metrics.jsonl")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT) and "NG_TRAINER_MODULE" not in env
    _, env = launcher_command(_spec(tmp_path, trainer_module="tests.support.stand_in_trainer"))
    assert env["NG_TRAINER_MODULE"] == "tests.support.stand_in_trainer"


def test_a_second_job_on_a_folder_in_use_is_refused_naming_the_first_jobs_pid(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from recipe.nemo_gym_demo.console import hold_output_folder\n"
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
    from recipe.nemo_gym_demo.console import spec_from_json, spec_to_json

    spec = JobSpec(
        out_dir=tmp_path / "out",
        model_dir=tmp_path / "model",
        environments_file=tmp_path / "plugin.yaml",
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
