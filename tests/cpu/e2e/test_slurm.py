# SPDX-License-Identifier: Apache-2.0
"""The submit scripts under a real Slurm: a private one-node cluster (tests/cpu/slurm_cluster.py) on this machine.

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
  scancel: each time nothing of it is left running;
- `sbatch submit_multienv.sh` with a `backend: cpu` job for real: verl's main_ppo trains step 1 through the CPU
  backend (recipe.nemo_gym.cpu_backend) with NeMo Gym's math and workplace environments; then the math
  server is killed, and the job FAILS, its output ending with the cause that names that server, and leaves no Ray,
  NeMo Gym or trainer process and nothing in /dev/shm or /tmp behind. (A job that COMPLETES is the stand-in
  trainer's case above; a real main_ppo finishing is `test_main_ppo.py`'s.)
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import psutil
import pytest
import yaml

from recipe.nemo_gym.leftovers import candidates, held_files, orphans
from tests.support.helpers import REPO_ROOT as REPO
from tests.support.helpers import TESTS_CPU, processes_with_env, set_keys

pytestmark = pytest.mark.integration

VENV = Path(sys.executable).parent.parent
SUBMIT = REPO / "submit_multienv.sh"
JOB_MARKER = "NG_SLURM_TEST_JOB"


def _load_harness():
    spec = importlib.util.spec_from_file_location("ng_slurm_cluster", TESTS_CPU / "slurm_cluster.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


slurm_cluster = _load_harness()


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


@pytest.fixture(scope="module")
def slurm():
    require_slurm()
    cluster = slurm_cluster.SlurmCluster().start()
    try:
        yield cluster
    finally:
        stop_and_check(cluster)


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
RAY_START_TIMEOUT = "The current node timed out during startup"


def submit_ray_job(cluster, tmp_path: Path, script: Path, *script_args: str, **kwargs):
    """`submit`, once more (with a warning) if Ray's head missed Ray's own start-up deadline."""
    record, log, left = submit(cluster, tmp_path, script, *script_args, **kwargs)
    ray_died = "exited before it answered on" in log or "exited while the job ran" in log
    if record.get("JobState") == "FAILED" and RAY_START_TIMEOUT in log and ray_died:
        job = record.get("JobId")
        warnings.warn(f"job {job}: `ray start` missed Ray's start-up deadline; submitting again", stacklevel=2)
        record, log, left = submit(cluster, tmp_path, script, *script_args, **kwargs)
    return record, log, left


def submit(cluster, tmp_path: Path, script: Path, *script_args: str, timeout_s: float, while_running=None, **env):
    """sbatch `script` from the repository root (as a user would: the job finds the repository through
    SLURM_SUBMIT_DIR), call `while_running(job_id)` if given, wait for the job's final state, and return (job
    record, log text, processes of the job still alive 30 s after it ended)."""
    token = uuid.uuid4().hex
    log = tmp_path / "job-%j.log"
    job_id = cluster.sbatch(
        script, "--nodes=1", f"--output={log}", script_args=script_args, cwd=REPO, **{JOB_MARKER: token}, **env
    )
    if while_running is not None:
        while_running(job_id)
    record = cluster.wait_job(job_id, timeout_s)
    log_path = Path(str(log).replace("%j", job_id))
    text = log_path.read_text(errors="replace") if log_path.exists() else "(no log)"
    left = wait_until_gone(cluster, f"{JOB_MARKER}={token}")
    return record, text, left


def job_failure(record: dict, log: str, cluster) -> str:
    return (
        f"JobState={record.get('JobState')} ExitCode={record.get('ExitCode')} Reason={record.get('Reason')}\n"
        f"--- job log (last 80 lines) ---\n" + "\n".join(log.splitlines()[-80:]) + f"\n{cluster.log_tails()}"
    )


@pytest.fixture(autouse=True)
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


def write_job(tmp_path: Path, ray_temp_dir: str, **keys) -> Path:
    """A job for submit_multienv.sh (jobs/multienv.yaml's keys) with data files that exist (empty unless written by
    the caller), this machine's free ports and short Ray folders; `keys` set more (`training__rollout_n=2`)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for name in ("train.jsonl", "val.jsonl"):
        (data / name).touch()
    ray_port, dashboard_port = slurm_cluster.free_ports(2)
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


def cancel_once_training(cluster, report: Path, timeout_s: float = 400):
    """A `while_running` callback: scancel the job once the stub trainer has written its report. A job that ended
    before is left to the caller's checks (and to `submit_ray_job`'s one retry, if Ray missed its start-up deadline)."""

    def cancel(job_id: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not report.exists():
            if cluster.job(job_id).get("JobState") in slurm_cluster.FINAL_STATES:
                return
            assert time.monotonic() < deadline, f"job {job_id} did not start training within {timeout_s} s"
            time.sleep(1)
        cluster.run("scancel", job_id)

    return cancel


@pytest.mark.parametrize("outcome", ["trainer-succeeds", "trainer-fails", "job-cancelled"])
def test_cpu_backend_job_starts_ray_for_the_backend_and_leaves_nothing(slurm, tmp_path, ray_temp_dir, outcome):
    job = write_job(tmp_path, ray_temp_dir, backend="cpu", cluster__ray_num_cpus=6)
    report = tmp_path / "report.json"
    record, log, left = submit_ray_job(
        slurm,
        tmp_path,
        SUBMIT,
        timeout_s=600,
        while_running=cancel_once_training(slurm, report) if outcome == "job-cancelled" else None,
        JOB=str(job),
        STUB_REPORT=str(report),
        STUB_TRAINER_EXIT="3" if outcome == "trainer-fails" else "0",
        STUB_TRAINER_SLEEP="600" if outcome == "job-cancelled" else "0",
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


# --- the real job on the CPU backend ---------------------------------------------------------------------------


def write_blend(tmp_path: Path, rows_per_env: int) -> Path:
    """NeMo Gym's example rows (from its wheel) for math and the workplace assistant, each with its agent,
    interleaved: the blend submit_multienv.sh trains on."""
    from recipe.nemo_gym_demo.data import with_tools

    roots = [Path(p) for p in importlib.util.find_spec("resources_servers").submodule_search_locations]
    sources = {
        "math_with_judge_simple_agent": "math_with_judge/data/example.jsonl",
        "workplace_assistant_simple_agent": "workplace_assistant/data/example.jsonl",
    }
    per_env = []
    for agent, relative in sources.items():
        path = next(root / relative for root in roots if (root / relative).is_file())  # a namespace package
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:rows_per_env]
        rows = [{**row, "agent_ref": {"name": agent}} for row in rows]
        if agent.startswith("workplace"):
            # Two of its 27 tools: the prompt shrinks from ~4,100 to ~500 tokens, and so does every step.
            rows = [with_tools(row, ("company_directory_find_email_address", "email_reply_email")) for row in rows]
        per_env.append(rows)
    blend = [row for pair in zip(*per_env, strict=False) for row in pair]
    out = tmp_path / "blend.jsonl"
    out.write_text("".join(json.dumps(row) + "\n" for row in blend))
    return out


def kill_after_step_1(cluster, job_log: Path, server: str, timeout_s: float = 1200):
    """A `while_running` callback: once verl's console logger has printed step 1, SIGKILL the job's processes of
    NeMo Gym's server `server` (a top-level key of Gym's config, which Gym puts in each server's environment as
    NEMO_GYM_CONFIG_PATH; the job's, by Slurm's SLURM_JOB_ID there)."""

    def kill(job_id: str) -> None:
        log = Path(str(job_log).replace("%j", job_id))
        deadline = time.monotonic() + timeout_s
        while not (log.exists() and re.search(r"\bstep:1 - ", log.read_text(errors="replace"))):
            state = cluster.job(job_id).get("JobState")
            assert state not in slurm_cluster.FINAL_STATES, f"job {job_id} ended ({state}) before step 1"
            assert time.monotonic() < deadline, f"job {job_id} did not train step 1 within {timeout_s} s"
            time.sleep(1)
        killed = []
        for proc in processes_with_env("NEMO_GYM_CONFIG_PATH", server):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("SLURM_JOB_ID") == job_id:
                    proc.kill()
                    killed.append(proc.pid)
        assert killed, f"no process of job {job_id} is NeMo Gym's {server!r} server"

    return kill


@pytest.mark.timeout(1800)
def test_submit_multienv_trains_under_slurm_and_a_killed_gym_server_ends_the_job_naming_it(
    slurm, tmp_path, ray_temp_dir
):
    from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir

    blend = write_blend(tmp_path, rows_per_env=3)  # 3 steps of one math and one workplace row
    job = write_job(
        tmp_path,
        ray_temp_dir,
        backend="cpu",
        model=str(tiny_qwen3_dir()),
        data={"train_files": [str(blend)], "val_files": [str(blend)]},
        training={
            "train_batch_size": 2,
            "rollout_n": 2,
            "ppo_mini_batch_size": 2,
            "micro_batch_size_per_gpu": 1,
            "max_prompt_length": 1024,
            "max_response_length": 32,
            "total_training_steps": 3,
            "save_freq": -1,
            "test_freq": -1,
            "val_before_train": False,
        },
        logging={"project": "nemo_gym_slurm", "experiment": "cpu_backend", "loggers": ["console"]},
    )
    started = time.time()
    record, log, left = submit_ray_job(
        slurm,
        tmp_path,
        SUBMIT,
        "data.dataloader_num_workers=0",
        timeout_s=1500,
        while_running=kill_after_step_1(slurm, tmp_path / "job-%j.log", "math_with_judge"),
        JOB=str(job),
    )
    ended = time.time()
    failure = job_failure(record, log, slurm)
    print(f"job {record.get('JobId')}: {record.get('JobState')} after RunTime={record.get('RunTime')}")
    assert record["JobState"] == "FAILED" and record["ExitCode"] == "1:0", failure
    assert re.search(r"\bstep:1 - ", log) and not re.search(r"\bstep:3 - ", log), failure  # verl's console logger
    # The job's output ends with the trainer's error: the plugin names the server that died.
    lines = log.rstrip().splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("launch: the trainer failed (exit status 1)"))
    assert lines[failed + 1].startswith("launch:   RolloutAborted: NeMo Gym server(s) ['math_with_judge"), failure
    assert "died with" in lines[failed + 1], failure
    assert left == [], f"left running after the job (Ray, NeMo Gym or trainer processes): {left}"
    # vLLM's shared-memory ring buffers and verl's buckets and sockets: the launcher removes the job's.
    litter = orphans(candidates(), held_files(), since=started, until=ended)
    assert litter == [], f"left in /dev/shm or /tmp by the job: {litter}"
