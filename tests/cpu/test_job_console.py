# SPDX-License-Identifier: Apache-2.0
"""The CPU job runner's console: verl's logged step metrics and the manager's progress lines, as a user sees them."""

from __future__ import annotations

from recipe.nemo_gym_testing.cpu_training.job import (
    RAY_START_TIMEOUT,
    JobResult,
    environments,
    format_step,
    missed_ray_start,
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
    data = {"val-core/math/reward/mean@1": 0.0, "val-core/workplace/reward/mean@1": 1.0}
    assert format_step({"step": 0, "data": data}) == "step 0 | validation math=0.000 workplace=1.000"


def test_only_a_run_that_failed_at_rays_start_up_deadline_is_run_again():
    log = f"Exception: {RAY_START_TIMEOUT}. This could happen because some of the raylet failed to startup\n"
    assert missed_ray_start(JobResult(returncode=1, elapsed_s=60.0), log)
    assert not missed_ray_start(JobResult(returncode=0, elapsed_s=60.0), log)
    assert not missed_ray_start(JobResult(returncode=1, elapsed_s=60.0), "ValueError: bad override\n")
    # once a step ran, a failure is the job's own: never run a training job twice
    assert not missed_ray_start(JobResult(returncode=1, elapsed_s=60.0, steps=[{"step": 1, "data": {}}]), log)
