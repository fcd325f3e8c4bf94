# SPDX-License-Identifier: Apache-2.0
"""`launch ray-env`: what the Ray bootstrap exports before `ray start`, Ray's token authentication included."""

from __future__ import annotations

import shlex
from pathlib import Path

from recipe.nemo_gym.launch.__main__ import shell_settings
from recipe.nemo_gym.launch.cluster import this_node_address
from recipe.nemo_gym.launch.compose import Launch
from recipe.nemo_gym.launch.job import Job

JOB = Job.model_validate(
    {
        "model": "/m",
        "checkpoint_dir": "/ck",
        "environments": "/e.yaml",
        "data": {"train_files": ["/t.jsonl"], "val_files": ["/v.jsonl"]},
    }
)
LAUNCH = Launch(overrides=[], environment={"VERL_PLATFORM": "cpu"}, ray_start_args=["--num-gpus=8"])


def _exports(environ: dict[str, str]) -> dict[str, str]:
    lines = shell_settings(JOB, LAUNCH, environ).splitlines()
    return dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines if line.startswith("export")
    )


def test_the_job_gets_token_authentication_with_a_fresh_token_of_its_own():
    first, second = _exports({}), _exports({})
    assert first["RAY_AUTH_MODE"] == "token" and len(first["RAY_AUTH_TOKEN"]) == 64
    assert first["RAY_AUTH_TOKEN"] != second["RAY_AUTH_TOKEN"]
    assert first["VERL_PLATFORM"] == "cpu" and first["NG_RAY_START_ARGS"] == "--num-gpus=8"
    assert Path(first["PATH"].split(":")[0]).is_dir()  # this environment's `ray` first


def test_a_users_own_ray_authentication_is_left_alone():
    assert "RAY_AUTH_TOKEN" not in _exports({"RAY_AUTH_TOKEN_PATH": "/secrets/ray"})
    assert _exports({"RAY_AUTH_TOKEN_PATH": "/secrets/ray"})["RAY_AUTH_MODE"] == "token"
    chosen = _exports({"RAY_AUTH_MODE": "disabled"})
    assert "RAY_AUTH_MODE" not in chosen and "RAY_AUTH_TOKEN" not in chosen


def test_the_head_address_is_loopback_without_slurm_and_this_nodes_own_in_a_slurm_job():
    assert _exports({})["NG_HEAD_IP"] == "127.0.0.1"
    assert _exports({"SLURM_JOB_ID": "7"})["NG_HEAD_IP"] == this_node_address()


def test_the_jobs_temporary_folder_goes_under_tmpdir_unless_it_is_too_long_for_rays_sockets(capsys):
    assert _exports({})["NG_JOB_TEMP_PARENT"] == "/tmp"
    assert _exports({"TMPDIR": "/tmp/slurm-7"})["NG_JOB_TEMP_PARENT"] == "/tmp/slurm-7"
    assert capsys.readouterr().err == ""
    long_temp = "/scratch/users/alice/slurm-1234567/tmp"
    assert _exports({"TMPDIR": long_temp})["NG_JOB_TEMP_PARENT"] == "/tmp"
    assert f"TMPDIR {long_temp} is too long for the Unix socket paths of Ray under it" in capsys.readouterr().err
