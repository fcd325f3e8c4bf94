# SPDX-License-Identifier: Apache-2.0
"""The launcher's checks of the environments file and of the NeMo Gym environment it names (`launch/checks.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.launch import checks
from recipe.nemo_gym.launch.job import Job
from tests.support.helpers import REPO_ROOT

GYM_PYTHON = REPO_ROOT / ".venv-gym" / "bin" / "python"


def _job(tmp_path: Path, environments: str, **keys: object) -> Job:
    path = tmp_path / "environments.yaml"
    path.write_text(environments)
    raw = {
        "model": "/m",
        "checkpoint_dir": "/ck",
        "environments": str(path),
        "data": {"train_files": ["/t.jsonl"], "val_files": ["/v.jsonl"]},
        **keys,
    }
    return Job.model_validate(raw)


def test_the_environments_file_is_validated_by_the_plugins_own_loader(tmp_path):
    job = _job(tmp_path, "nemo_gym:\n  config_paths: [a.yaml]\ntimeouts:\n  batch_s: 60\n")
    assert checks.check_environments(job) == NeMoGymConfig.model_validate(
        {"nemo_gym": {"config_paths": ["a.yaml"]}, "timeouts": {"batch_s": 60}}
    )
    with pytest.raises(ConfigError, match=r"^environments: .*environments\.yaml: timeouts\.batch_sec: Extra inputs"):
        checks.check_environments(_job(tmp_path, "nemo_gym:\n  config_paths: [a.yaml]\ntimeouts:\n  batch_sec: 60\n"))
    with pytest.raises(checks.Deferred, match=r"nemo_gym\.root: environment variable 'NG_TEST_UNSET' is not set"):
        checks.check_environments(_job(tmp_path, "nemo_gym:\n  root: ${NG_TEST_UNSET}\n  config_paths: [a.yaml]\n"))


def test_an_attached_gym_is_not_looked_for_on_the_launchers_machine(tmp_path):
    job = _job(tmp_path, "nemo_gym:\n  attach:\n    head_server_url: http://gym-node:11000\n", gym_env="/no/such/venv")
    said = checks.check_gym_environment(job, checks.check_environments(job))
    assert said == "attached to the Gym at http://gym-node:11000 (started elsewhere: not checked here)"


def test_the_gym_environment_checked_is_the_one_the_environments_file_names(tmp_path):
    job = _job(tmp_path, "nemo_gym:\n  environment: /no/such/venv\n  config_paths: [a.yaml]\n")
    with pytest.raises(ConfigError, match=r"^nemo_gym\.environment: no Python interpreter at /no/such/venv"):
        checks.check_gym_environment(job, checks.check_environments(job))
    assert checks.check_gym_environment(job, None).startswith(
        "nemo-gym "
    )  # a deferred file: $NEMO_GYM_ENV, else .venv-gym


def test_a_job_naming_a_second_gym_environment_is_refused_naming_both(tmp_path):
    job = _job(tmp_path, f"nemo_gym:\n  environment: {GYM_PYTHON}\n  config_paths: [a.yaml]\n", gym_env="/other/venv")
    with pytest.raises(ConfigError, match=rf"^gym_env: /other/venv differs from nemo_gym.environment {GYM_PYTHON}"):
        checks.check_gym_environment(job, checks.check_environments(job))
    same = job.model_copy(update={"gym_env": GYM_PYTHON})
    assert f"at {GYM_PYTHON}" in checks.check_gym_environment(same, checks.check_environments(same))
