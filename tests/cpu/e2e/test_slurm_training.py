# SPDX-License-Identifier: Apache-2.0
"""A real training job under a real Slurm (the private one-node cluster of tests/support/slurm_cluster.py):
`sbatch submit_multienv.sh` with a `backend: cpu` job. verl's main_ppo trains step 1 through the CPU backend
(recipe.nemo_gym.cpu_backend) with NeMo Gym's math and workplace environments; then the math server is killed, and
the job FAILS, its output ending with the cause that names that server, and leaves no Ray, NeMo Gym or trainer
process and nothing in /dev/shm or /tmp behind. (A job that COMPLETES is the stand-in trainer's case in
`test_slurm.py`; a real main_ppo finishing is `test_main_ppo.py`'s.)
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import time
from pathlib import Path

import psutil
import pytest

from recipe.nemo_gym.launch.leftovers import candidates, held_files, orphans
from tests.support.engine import TEST_KV_CACHE
from tests.support.helpers import processes_with_env
from tests.support.slurm_jobs import SUBMIT, job_failure, submit_ray_job, wait_for_step, write_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("user_ray_auth_environment")]


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
        wait_for_step(cluster, job_log, job_id, 1, timeout_s)
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
        TEST_KV_CACHE,
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
