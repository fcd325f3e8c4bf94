# SPDX-License-Identifier: Apache-2.0
"""The submit scripts under a real Slurm: a private one-node cluster (tests/support/slurm_cluster.py) on this
machine, with stand-in trainers (the real trainer's job is `test_slurm_training.py`'s).

Slurm (Debian's slurm-wlm) and munge must be installed and the tests must run as root: ./run_tests.sh installs
the packages when they are missing (tests/cpu/install_slurm.sh). Where Slurm cannot run, every test here fails
saying what is missing and how to install it; NG_SLURM_TESTS=skip turns that into a skip with the same message.

- the harness: the cluster is private (own config, ports, munge key and socket), reaches idle, runs a batch job
  with a step, and stops without leaving a process behind;
- `sbatch submit_multienv.sh` with DRY_RUN=1 (both backends): the trainer command printed from inside the job;
- `sbatch submit_multienv.sh` with a `backend: cpu` job through the bootstrap's real Slurm + Ray path (srun,
  `ray start --block`, the launcher waiting for the nodes, supervision, teardown), with the backend module and the
  trainer replaced by stand-ins that record what they were given (`NG_CPU_BACKEND_MODULE`, `NG_TRAINER_MODULE`):
  Ray's resources, the backend's environment in Ray workers, the empty CUDA_VISIBLE_DEVICES unset, Ray's token
  authentication; the job COMPLETES, or FAILS with a failing trainer's status and its error last, or is CANCELLED by
  scancel: each time nothing of it is left running.

No trainer or vLLM engine runs here (a few hundred MB: the daemons, Ray's head, the stand-ins), so this module runs
beside the heavy ones (tests/cpu/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import slurm_cluster
from tests.support.helpers import REPO_ROOT as REPO
from tests.support.slurm_jobs import (
    SUBMIT,
    job_failure,
    require_slurm,
    stop_and_check,
    submit,
    submit_ray_job,
    write_job,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("user_ray_auth_environment")]

VENV = Path(sys.executable).parent.parent


# --- when Slurm is missing, and its installation ------------------------------------------------------------


def test_missing_slurm_fails_naming_the_commands_and_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(slurm_cluster, "SEARCH_PATH", str(tmp_path))  # no command found
    monkeypatch.delenv("NG_SLURM_TESTS", raising=False)
    with pytest.raises(pytest.fail.Exception) as failed:
        require_slurm()
    message = str(failed.value)
    assert "Slurm/munge commands not found: munged, slurmctld, slurmd, sbatch, srun" in message
    assert "apt-get install -y --no-install-recommends slurm-wlm munge" in message
    monkeypatch.setenv("NG_SLURM_TESTS", "skip")  # the explicit opt-out: a skip with the same message
    with pytest.raises(pytest.skip.Exception, match="NG_SLURM_TESTS=skip: Slurm/munge commands not found"):
        require_slurm()


def test_install_step_is_quiet_when_installed_and_explains_when_it_will_not_install(tmp_path):
    script = REPO / "tests" / "cpu" / "install_slurm.sh"
    present = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, check=False)
    if slurm_cluster.unavailable_reason() is None:
        assert (present.returncode, present.stdout, present.stderr) == (0, "", "")
    # Commands missing (an empty PATH here) and installation turned off: a message, never a failed test run.
    env = {"PATH": str(tmp_path), "NG_SLURM_INSTALL": "0"}
    off = subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert off.returncode == 0, off.stderr
    assert "Slurm commands missing (sbatch srun scontrol sinfo" in off.stderr
    assert "NG_SLURM_INSTALL=0, not installing" in off.stderr
    assert "apt-get install -y --no-install-recommends slurm-wlm munge" in off.stderr


# --- the harness ----------------------------------------------------------------------------------------------


def test_private_cluster_is_isolated_reaches_idle_and_stops_completely():
    require_slurm()
    cluster = slurm_cluster.SlurmCluster().start()
    try:
        conf = cluster.conf.read_text()
        assert f"SlurmctldPort={cluster.ctld_port}\n" in conf and f"SlurmdPort={cluster.slurmd_port}\n" in conf
        assert f"AuthInfo=socket={cluster.munge_socket}\n" in conf
        assert "ProctrackType=proctrack/linuxproc\n" in conf and "SelectType=select/cons_tres\n" in conf
        assert "AccountingStorageType=accounting_storage/none\n" in conf
        # The controller that answers is ours: the running config is the file we wrote, on our port.
        shown = cluster.run("scontrol", "show", "config").stdout
        assert re.search(rf"^SLURM_CONF\s+= {re.escape(str(cluster.conf))}$", shown, re.M), shown
        assert re.search(rf"^SlurmctldPort\s+= {cluster.ctld_port}$", shown, re.M), shown
        node = slurm_cluster.parse_scontrol_record(cluster.run("scontrol", "show", "node", "--oneliner").stdout)
        assert node["State"] == "IDLE" and node["CPUTot"] == str(os.cpu_count())
        assert int(node["RealMemory"]) > 0
        assert {daemon.name for daemon in cluster.daemons} == {"munged", "slurmctld", "slurmd"}
        assert len(cluster.processes()) == 3
    finally:
        stop_and_check(cluster)


def test_batch_job_with_a_step_completes(slurm, tmp_path):
    script = tmp_path / "trivial.sh"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        'echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST conf=$SLURM_CONF"\n'
        'scontrol show hostnames "$SLURM_JOB_NODELIST"\n'
        "srun --overlap --nodes=1 --ntasks=1 hostname --ip-address\n"
    )
    record, log, left = submit(slurm, tmp_path, script, timeout_s=60)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", job_failure(record, log, slurm)
    assert f"conf={slurm.conf}" in log and slurm.node in log.splitlines()[1]
    assert left == []


# --- the submit script, DRY_RUN --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_dry_run_job_prints_the_trainer_command_from_inside_the_job(slurm, tmp_path, ray_temp_dir, backend):
    job = write_job(tmp_path, ray_temp_dir, backend=backend)
    python = str(VENV / "bin" / "python")
    record, log, left = submit(slurm, tmp_path, SUBMIT, timeout_s=120, JOB=str(job), DRY_RUN="1", PYTHON=python)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", job_failure(record, log, slurm)
    lines = log.splitlines()
    start = lines.index(python)
    assert lines[start + 1 : start + 3] == ["-m", "verl.trainer.main_ppo"]
    overrides = lines[start + 3 :]
    assert f"trainer.default_local_dir='{tmp_path / 'ckpt'}'" in overrides
    assert f"DRY_RUN: backend {backend}; each node's 'ray start' gets:" in log
    if backend == "cpu":
        assert "trainer.device=cpu" in overrides and "trainer.n_gpus_per_node=1" in overrides
        assert "--num-gpus=1 --num-cpus=8" in log
    else:
        assert "trainer.n_gpus_per_node=8" in overrides and "--num-gpus=8\n" in log
    assert left == []


# --- the submit script's Slurm + Ray path, backend and trainer stubbed -----------------------------------------

STUB_OVERRIDES = ["trainer.n_gpus_per_node=1", "+stub.backend_override=1"]
STUB_ENV = {"STUB_BACKEND_VAR": "from-the-backend", "VERL_USE_EXTERNAL_MODULES": "stub.activate"}

# The CPU backend's stand-in (NG_CPU_BACKEND_MODULE): the launcher's contract with a backend module.
STUB_BACKEND = f"""
def cpu_overrides(start_ray=True):
    return {STUB_OVERRIDES!r}

def cpu_env():
    return {STUB_ENV!r}
"""

# The trainer stand-in (NG_TRAINER_MODULE): joins the Ray cluster the bootstrap started (RAY_ADDRESS), records its
# arguments, Ray's resources and what a one-GPU Ray task sees, leaves a child process behind for the launcher to
# stop, sleeps STUB_TRAINER_SLEEP seconds (a job to cancel meanwhile) and exits with STUB_TRAINER_EXIT.
STUB_TRAINER = """
import json, os, subprocess, sys, time
import ray

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")

@ray.remote(num_gpus=1)
def probe():
    seen = {key: os.environ.get(key) for key in ("STUB_BACKEND_VAR", "VERL_USE_EXTERNAL_MODULES", "PYTHONPATH")}
    return {**seen, "auth": (os.environ.get("RAY_AUTH_MODE"), len(os.environ.get("RAY_AUTH_TOKEN", "")))}

report = {
    "argv": sys.argv[1:],
    "resources": ray.cluster_resources(),
    "task": ray.get(probe.remote()),
    "driver_cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
}
ray.shutdown()
subprocess.Popen(["sleep", "600"])  # the trainer's own child: the job's teardown must not leave it
# A daemon of the trainer's, in a session of its own (as `ray start` leaves Ray's processes when it is killed): out of
# the launcher's process group and of Slurm's sight; only the job's TMPDIR, which it carries, finds it.
subprocess.Popen(["sleep", "601"], start_new_session=True)
with open(os.environ["STUB_REPORT"] + ".tmp", "w") as out:
    json.dump(report, out)
os.rename(os.environ["STUB_REPORT"] + ".tmp", os.environ["STUB_REPORT"])
time.sleep(float(os.environ.get("STUB_TRAINER_SLEEP", "0")))
status = int(os.environ.get("STUB_TRAINER_EXIT", "0"))
if status:
    import traceback
    try:
        raise RuntimeError("stub trainer: the cause a user must see")
    except RuntimeError:
        traceback.print_exc()
sys.exit(status)
"""


def stub_modules(tmp_path: Path) -> dict[str, str]:
    """The environment that makes the launcher run the stand-ins above: a folder on PYTHONPATH holding them."""
    folder = tmp_path / "stubs"
    folder.mkdir()
    (folder / "stub_backend.py").write_text(STUB_BACKEND)
    (folder / "stub_trainer.py").write_text(STUB_TRAINER)
    return {"PYTHONPATH": str(folder), "NG_CPU_BACKEND_MODULE": "stub_backend", "NG_TRAINER_MODULE": "stub_trainer"}


def once_training(cluster, report: Path, act, timeout_s: float = 400):
    """A `while_running` callback: `act(job_id)` once the stub trainer has written its report. A job that ended before
    is left to the caller's checks (and to `submit_ray_job`'s one retry, if Ray missed its start-up deadline)."""

    def wait_then_act(job_id: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not report.exists():
            if cluster.job(job_id).get("JobState") in slurm_cluster.FINAL_STATES:
                return
            assert time.monotonic() < deadline, f"job {job_id} did not start training within {timeout_s} s"
            time.sleep(1)
        act(job_id)

    return wait_then_act


def kill_ray_head(cluster, job_id: str) -> None:
    """SIGKILL the job's `ray start --head --block`: its srun step ends, as when the head node's Ray dies."""
    heads = [p for p in cluster.processes(f"SLURM_JOB_ID={job_id}") if {"start", "--head"} <= set(p.cmdline())]
    assert heads, f"job {job_id} has no `ray start --head` process"
    for process in heads:
        process.kill()


@pytest.mark.parametrize("outcome", ["trainer-succeeds", "trainer-fails", "job-cancelled", "ray-head-dies"])
def test_cpu_backend_job_starts_ray_for_the_backend_and_leaves_nothing(slurm, tmp_path, ray_temp_dir, outcome):
    job = write_job(tmp_path, ray_temp_dir, backend="cpu", cluster__ray_num_cpus=6)
    report = tmp_path / "report.json"
    record, log, left = submit_ray_job(
        slurm,
        tmp_path,
        SUBMIT,
        timeout_s=600,
        while_running={
            "job-cancelled": once_training(slurm, report, lambda job_id: slurm.run("scancel", job_id)),
            "ray-head-dies": once_training(slurm, report, lambda job_id: kill_ray_head(slurm, job_id)),
        }.get(outcome),
        JOB=str(job),
        STUB_REPORT=str(report),
        STUB_TRAINER_EXIT="3" if outcome == "trainer-fails" else "0",
        STUB_TRAINER_SLEEP="600" if outcome in ("job-cancelled", "ray-head-dies") else "0",
        CUDA_VISIBLE_DEVICES="",  # as some CPU setups export it: Ray would refuse its logical GPU
        **stub_modules(tmp_path),
    )
    failure = job_failure(record, log, slurm)
    if outcome == "trainer-succeeds":
        assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", failure
        assert log.rstrip().splitlines()[-1] == "launch: training finished", failure
    elif outcome == "trainer-fails":
        assert record["JobState"] == "FAILED" and record["ExitCode"] == "3:0", failure
        # The job's output ends with the trainer's error, after the bootstrap has stopped Ray.
        assert log.rstrip().splitlines()[-2:] == [
            "launch: the trainer failed (exit status 3); its error, from the end of its output:",
            "launch:   RuntimeError: stub trainer: the cause a user must see",
        ], failure
    elif outcome == "ray-head-dies":
        # The bootstrap stops the launcher's step with SIGTERM (not srun's SIGKILL): the launcher stops the trainer
        # and says how the job ended, then the bootstrap's last line names the Ray piece that died.
        assert record["JobState"] == "FAILED" and record["ExitCode"] == "1:0", failure
        assert "launch: SIGTERM received: SIGINT to the trainer" in log, failure
        assert "forcing job termination" not in log, failure  # the head's srun was gone: none was killed
        assert log.rstrip().splitlines()[-2:] == [
            "launch: the job was stopped by SIGTERM (exit status 143)",
            f"ray_on_slurm: ERROR: the job failed because the Ray head on {slurm.node} exited while the job ran",
        ], failure
    else:
        # Slurm signals every process of the batch step at once (the script, the launcher, the trainer, srun); the
        # bootstrap's TERM trap still runs its teardown, and nothing may survive it.
        assert record["JobState"] == "CANCELLED" and "launch: training finished" not in log, failure
    assert report.exists(), failure
    seen = json.loads(report.read_text())
    # Ray was started by the bootstrap (srun ... ray start --block) with the backend's sizes.
    assert seen["resources"]["GPU"] == 1.0 and seen["resources"]["CPU"] == 6.0, seen["resources"]
    assert seen["driver_cuda_visible_devices"] == "<unset>"
    # The backend's environment reached a Ray worker, with the plugin's module list merged with the backend's.
    assert seen["task"]["STUB_BACKEND_VAR"] == "from-the-backend"
    assert seen["task"]["VERL_USE_EXTERNAL_MODULES"] == "recipe.nemo_gym.vllm_plugin,stub.activate"
    assert seen["task"]["PYTHONPATH"].split(":")[0] == str(REPO)
    # Token authentication, with the job's own token, in every process (and never in the log).
    assert seen["task"]["auth"] == ["token", 64]
    assert "RAY_AUTH_TOKEN" not in log
    argv = seen["argv"]
    assert argv.index("trainer.n_gpus_per_node=1") > argv.index("actor_rollout_ref.rollout.name=vllm")
    assert "trainer.n_gpus_per_node=8" not in argv and "+stub.backend_override=1" in argv
    assert not [item for item in argv if "ray_init.num_" in item]
    assert (
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='recipe.nemo_gym.vllm_plugin,stub.activate'"
        in argv
    )
    assert left == [], f"left running after the job: {left}\n{failure}"
    if outcome in ("trainer-succeeds", "trainer-fails"):
        # The trainer's daemon, in no process group the launcher stops: the bootstrap found it by the job's TMPDIR.
        # (A cancelled step's processes, the daemon among them, are killed by Slurm itself.)
        assert re.search(r"ray_on_slurm: stopping pid \d+ \(sleep\) on \S+, which the job left running", log), failure
