# SPDX-License-Identifier: Apache-2.0
"""Jobs on the private Slurm cluster (`tests/support/slurm_cluster.py`), for the modules that submit the submit
scripts (`tests/cpu/e2e/test_slurm.py`, `test_slurm_training.py`; their fixtures are in `tests/cpu/e2e/conftest.py`).

- `require_slurm()`: fail naming what is missing (NG_SLURM_TESTS=skip: skip), never pass without Slurm;
- `submit(...)`: sbatch a script from the repository root, wait for its final state, and return the job's record,
  its log and what of it is still alive 30 s after it ended; `submit_ray_job` submits once more if Ray's head
  missed Ray's own start-up deadline;
- `write_job(...)`: a job file for submit_multienv.sh with this machine's free ports and short Ray folders.
"""

from __future__ import annotations

import os
import re
import time
import uuid
import warnings
from pathlib import Path

import psutil
import pytest
import yaml

from recipe.nemo_gym.ray_start import missed_ray_start
from tests.support import slurm_cluster
from tests.support.helpers import REPO_ROOT as REPO
from tests.support.helpers import set_keys

SUBMIT = REPO / "submit_multienv.sh"
JOB_MARKER = "NG_SLURM_TEST_JOB"


def require_slurm() -> None:
    """Fail (or, with NG_SLURM_TESTS=skip, skip) naming what is missing; never pass without Slurm."""
    reason = slurm_cluster.unavailable_reason()
    if reason is None:
        return
    if os.environ.get("NG_SLURM_TESTS") == "skip":
        pytest.skip(f"NG_SLURM_TESTS=skip: {reason}")
    pytest.fail(f"Slurm tests cannot run: {reason}", pytrace=False)


def stop_and_check(cluster) -> None:
    pids = [daemon.process.pid for daemon in cluster.daemons]
    leftovers = cluster.stop()
    assert leftovers == [], f"processes of the cluster or its jobs outlived it (killed now): {leftovers}"
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert alive == [], f"daemons still running: {alive}"
    assert cluster.processes() == []
    assert not cluster.root.exists()


def wait_until_gone(cluster, marker: str, timeout_s: float = 30) -> list[str]:
    """The processes carrying `marker` (KEY=VALUE) that are still alive after up to `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = cluster.describe(cluster.processes(marker))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


# Ray's own start-up gives the raylet a fixed 30 s to register (ray/_private/node.py); on a 2-core machine that
# other work keeps busy, `ray start` can miss it. That is no fault of the scripts (which then fail the job as they
# should), so a job that failed exactly so is submitted once more, with a warning.


def submit_ray_job(cluster, tmp_path: Path, script: Path, *script_args: str, **kwargs):
    """`submit`, once more (with a warning) if Ray's head missed Ray's own start-up deadline."""
    record, log, left = submit(cluster, tmp_path, script, *script_args, **kwargs)
    ray_died = "exited before it answered on" in log or "exited while the job ran" in log
    if record.get("JobState") == "FAILED" and missed_ray_start(log) and ray_died:
        job = record.get("JobId")
        warnings.warn(f"job {job}: `ray start` missed Ray's start-up deadline; submitting again", stacklevel=2)
        record, log, left = submit(cluster, tmp_path, script, *script_args, **kwargs)
    return record, log, left


def submit(
    cluster,
    tmp_path: Path,
    script: Path,
    *script_args: str,
    timeout_s: float,
    while_running=None,
    nodes: int = 1,
    partition: str | None = None,
    **env,
):
    """sbatch `script` on `nodes` nodes (of `partition`: the default one unless named) from the repository root (as a
    user would: the job finds the repository through SLURM_SUBMIT_DIR), call `while_running(job_id)` if given, wait
    for the job's final state, and return (job record, log text, processes of the job still alive 30 s after it
    ended)."""
    token = uuid.uuid4().hex
    log = tmp_path / "job-%j.log"
    options = [f"--nodes={nodes}", f"--output={log}", *([f"--partition={partition}"] if partition else [])]
    job_id = cluster.sbatch(script, *options, script_args=script_args, cwd=REPO, **{JOB_MARKER: token}, **env)
    if while_running is not None:
        while_running(job_id)
    record = cluster.wait_job(job_id, timeout_s)
    log_path = Path(str(log).replace("%j", job_id))
    text = log_path.read_text(errors="replace") if log_path.exists() else "(no log)"
    left = wait_until_gone(cluster, f"{JOB_MARKER}={token}")
    return record, text, left


def wait_for_step(cluster, job_log: Path, job_id: str, step: int, timeout_s: float) -> None:
    """Return once verl's console logger has printed `step` in the job's log (`job_log`, `%j` for the job id); fail if
    the job ends first or `timeout_s` passes."""
    log = Path(str(job_log).replace("%j", job_id))
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and re.search(rf"\bstep:{step} - ", log.read_text(errors="replace"))):
        state = cluster.job(job_id).get("JobState")
        assert state not in slurm_cluster.FINAL_STATES, f"job {job_id} ended ({state}) before step {step}"
        assert time.monotonic() < deadline, f"job {job_id} did not train step {step} within {timeout_s} s"
        time.sleep(1)


def job_failure(record: dict, log: str, cluster) -> str:
    return (
        f"JobState={record.get('JobState')} ExitCode={record.get('ExitCode')} Reason={record.get('Reason')}\n"
        f"--- job log (last 80 lines) ---\n" + "\n".join(log.splitlines()[-80:]) + f"\n{cluster.log_tails()}"
    )


def write_job(tmp_path: Path, ray_temp_dir: str, **keys) -> Path:
    """A job for submit_multienv.sh (jobs/multienv.yaml's keys) with data files that exist (empty unless written by
    the caller), this machine's free ports and short Ray folders; `keys` set more (`training__rollout_n=2`)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for name in ("train.jsonl", "val.jsonl"):
        (data / name).touch()
    ray_port, dashboard_port, client_port = slurm_cluster.free_ports(3)
    job = {
        "model": str(tmp_path / "model"),
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "environments": str(REPO / "recipe" / "nemo_gym" / "configs" / "multienv.yaml"),
        "data": {"train_files": [str(data / "train.jsonl")], "val_files": [str(data / "val.jsonl")]},
        "cluster": {
            "nnodes": 1,
            "gpus_per_node": 8,
            "ray_port": ray_port,
            "ray_dashboard_port": dashboard_port,
            "ray_client_server_port": client_port,  # Ray's default, 10001, is in NeMo Gym's server port range
            "ray_temp_dir": ray_temp_dir,
            "ray_join_timeout_s": 240,
            "ray_poll_interval_s": 5,
            "stop_grace_s": 30,
        },
    }
    set_keys(job, **keys)
    path = tmp_path / "multienv.yaml"
    path.write_text(yaml.safe_dump(job))
    return path
