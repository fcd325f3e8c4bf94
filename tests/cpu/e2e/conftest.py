# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the modules that run jobs under the private Slurm cluster (test_slurm.py, test_slurm_training.py)."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.support import slurm_cluster, slurm_jobs


@pytest.fixture(scope="module")
def slurm():
    slurm_jobs.require_slurm()
    cluster = slurm_cluster.SlurmCluster().start()
    try:
        yield cluster
    finally:
        slurm_jobs.stop_and_check(cluster)


@pytest.fixture
def user_ray_auth_environment(monkeypatch):
    """A job submitted from a user's shell, not from this pytest process: an in-process `ray.init()` of an
    earlier test sets RAY_AUTH_MODE=token in os.environ (Ray 2.60 turns token authentication on for a new local
    cluster), and the script keeps an authentication mode it is given, so it would not make the job's token."""
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def ray_temp_dir():
    """Ray's temporary folder for one job: short (Ray puts Unix sockets in it), removed afterwards."""
    path = tempfile.mkdtemp(prefix="ngray-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
