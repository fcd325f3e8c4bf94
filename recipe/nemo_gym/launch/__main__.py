# SPDX-License-Identifier: Apache-2.0
"""`python -m recipe.nemo_gym.launch COMMAND JOB [--set key=value]... [verl overrides...]`: see `launch/__init__`.

Two environment variables exist for the tests of the launcher's own semantics (a stand-in trainer and CPU backend
that record what they were given, `tests/cpu/e2e/test_slurm.py`); a user sets neither: `NG_TRAINER_MODULE` (what
`python -m` runs instead of `verl.trainer.main_ppo`) and `NG_CPU_BACKEND_MODULE` (a module with `cpu_overrides` and
`cpu_env`, instead of the CPU backend's).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import secrets
import shlex
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from recipe.nemo_gym.errors import NeMoGymPluginError
from recipe.nemo_gym.launch import checks
from recipe.nemo_gym.launch.cluster import job_temp_parent, this_node_address, wait_for_nodes
from recipe.nemo_gym.launch.compose import CPU_DEFAULT_RAY_CPUS, TRAINER_MODULE, Backend, Launch, compose
from recipe.nemo_gym.launch.job import Job, load_job
from recipe.nemo_gym.launch.supervise import run_trainer, say

REPO_ROOT = Path(__file__).resolve().parents[3]
CPU_BACKEND_MODULE = "recipe.nemo_gym.cpu_backend.overrides"
"""Where the CPU backend's overrides and environment live; imported only by a `backend: cpu` job."""


def backend_of(job: Job, environ: Mapping[str, str], own_ray: bool = False) -> Backend:
    """The job's backend. With `own_ray` (`run` without a Ray cluster to join: no `RAY_ADDRESS` from the Ray
    bootstrap) the CPU backend's trainer starts a private local Ray with its resources; otherwise, as every other
    command describes the job, it joins the bootstrap's. A GPU trainer's own Ray counts the GPUs itself."""
    if job.backend == "gpu":
        return Backend()
    cpu = importlib.import_module(environ.get("NG_CPU_BACKEND_MODULE", CPU_BACKEND_MODULE))
    if job.cluster.gpus_per_node != 1:
        say(f"backend cpu: one logical GPU per node (cluster.gpus_per_node={job.cluster.gpus_per_node} ignored)")
    if own_ray:
        overrides = cpu.cpu_overrides(start_ray=True, num_cpus=job.cluster.ray_num_cpus or CPU_DEFAULT_RAY_CPUS)
    else:
        overrides = cpu.cpu_overrides(start_ray=False)
    return Backend(overrides=overrides, environment=cpu.cpu_env(), gpus_per_node=1)


def prepare(job: Job, overrides: Sequence[str], environ: Mapping[str, str], command: str) -> Launch:
    """Every check of `checks`, then the job composed for `command`. In a dry run a `Deferred` problem is only
    reported."""
    dry_run = command == "dry-run"

    def deferrable(check):
        try:
            return check()
        except checks.Deferred as e:
            if not dry_run:
                raise
            say(f"DRY_RUN: a real run would stop here: {e}")
            return None

    checks.check_data(job)
    environments = deferrable(lambda: checks.check_environments(job))
    launch = compose(
        job,
        backend_of(job, environ, own_ray=command == "run" and not environ.get("RAY_ADDRESS")),
        REPO_ROOT,
        cli_overrides=overrides,
        wandb=bool(environ.get("WANDB_API_KEY")),
        pythonpath=environ.get("PYTHONPATH", ""),
    )
    deferrable(lambda: checks.check_stack(job, REPO_ROOT / "uv.lock", environ))
    deferrable(lambda: checks.check_megatron_modules(job, launch.overrides))
    say(f"NeMo Gym: {checks.check_gym_environment(job, environments)}")
    return launch


def temp_parent(temp: str) -> str:
    """Where the job's temporary folder goes (`cluster.job_temp_parent`), saying so when it is not `temp`."""
    parent = job_temp_parent(temp)
    if parent != temp:
        say(f"TMPDIR {temp} is too long for the Unix socket paths of Ray under it: the job's temporary folder goes "
            f"under {parent}")  # fmt: skip
    return parent


def shell_settings(job: Job, launch: Launch, environ: Mapping[str, str]) -> str:
    """`export` lines for the Ray bootstrap (`ray_on_slurm.sh`): the job's environment, Ray's authentication, then
    the bootstrap's own settings (`NG_*`; NG_HEAD_IP: under Slurm, this node's address for the others, for the
    bootstrap runs this on the head node; else 127.0.0.1; NG_JOB_TEMP_PARENT: where the job's temporary folder goes,
    `job_temp_parent`). Values are shell-quoted; the secrets of the environment are
    not among them (a token is one only when the job gets a fresh one)."""
    c = job.cluster
    values = dict(launch.environment)
    values["PATH"] = f"{Path(sys.executable).parent}:{environ.get('PATH', '')}"  # `ray` of this environment
    # Ray 2.60: `ray start` turns token authentication on by itself when ~/.ray/auth_token exists, but a client sends
    # a token only when RAY_AUTH_MODE=token: one explicit mode, and a fresh token for every process of the job.
    if not environ.get("RAY_AUTH_MODE"):
        values["RAY_AUTH_MODE"] = "token"
        if not environ.get("RAY_AUTH_TOKEN") and not environ.get("RAY_AUTH_TOKEN_PATH"):
            values["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    values.update(
        NG_NNODES=str(c.nnodes),
        NG_RAY_PORT=str(c.ray_port),
        NG_RAY_DASHBOARD_PORT=str(c.ray_dashboard_port),
        NG_RAY_CLIENT_SERVER_PORT=str(c.ray_client_server_port),
        NG_RAY_JOIN_TIMEOUT_S=str(c.ray_join_timeout_s),
        NG_RAY_POLL_INTERVAL_S=str(c.ray_poll_interval_s),
        NG_RAY_TEMP_DIR=str(c.ray_temp_dir or ""),
        NG_STOP_GRACE_S=str(c.stop_grace_s),
        NG_RAY_START_ARGS=" ".join(launch.ray_start_args),
        NG_HEAD_IP=this_node_address() if environ.get("SLURM_JOB_ID") else "127.0.0.1",
        NG_JOB_TEMP_PARENT=temp_parent(environ.get("TMPDIR") or "/tmp"),
    )
    lines = [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    if job.backend == "cpu" and environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        lines.append("unset CUDA_VISIBLE_DEVICES  # Ray refuses --num-gpus=1 with an empty one; the CPU GPU is logical")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.nemo_gym.launch",
        description="Check, print or run a training job of verl with NeMo Gym environments.",
    )
    parser.add_argument(
        "command",
        choices=["check", "dry-run", "ray-env", "run"],
        help="check: the job, its data and stack; dry-run: print the trainer's command; ray-env: the settings the "
        "Ray bootstrap exports; run: run the trainer to its end",
    )
    parser.add_argument("job", type=Path, help="the job file (YAML; see jobs/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a job key")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for verl's main_ppo (they win)")
    args = parser.parse_intermixed_args(argv)
    environ = dict(os.environ)
    try:
        job = load_job(args.job, args.set, environ)
        launch = prepare(job, args.overrides, environ, args.command)
    except (NeMoGymPluginError, ValueError) as e:
        say(f"ERROR: {e}")
        return 1
    argv_ = launch.trainer_argv(sys.executable, environ.get("NG_TRAINER_MODULE", TRAINER_MODULE))
    if args.command == "check":
        say(f"{args.job}: a valid {job.backend} job of {len(argv_) - 3} overrides on {job.cluster.nnodes} node(s)")
    elif args.command == "dry-run":
        shown = " ".join(f"{k}={v}" for k, v in launch.environment.items())
        say(f"DRY_RUN: the trainer's command, one argument per line (nothing started); its processes get {shown}")
        say(f"DRY_RUN: backend {job.backend}; each node's 'ray start' gets: {' '.join(launch.ray_start_args)}")
        print("\n".join(argv_))
    elif args.command == "ray-env":
        print(shell_settings(job, launch, environ))
    else:
        return run(job, launch, argv_, environ)
    return 0


def run(job: Job, launch: Launch, argv: list[str], environ: Mapping[str, str]) -> int:
    """Wait for every node of the bootstrap's Ray cluster (when there is one: `RAY_ADDRESS`), then the trainer.
    Without one the trainer starts its own Ray, in a temporary folder of this run (its `TMPDIR`: Ray's session,
    vLLM's sockets, verl's locks), removed when the run has ended."""
    env = {**environ, **launch.environment}
    address = environ.get("RAY_ADDRESS")
    if address:
        c = job.cluster
        try:
            wait_for_nodes(address, c.nnodes, c.ray_join_timeout_s, c.ray_poll_interval_s, say=say)
        except NeMoGymPluginError as e:
            say(f"ERROR: {e}")
            return 1
    elif job.backend == "cpu" and env.get("CUDA_VISIBLE_DEVICES") == "":
        del env["CUDA_VISIBLE_DEVICES"]  # Ray refuses an empty one with a logical GPU; there is no GPU to hide
    say(f"starting the trainer ({job.experiment}, backend {job.backend}) against Ray at {address or 'its own'}")
    with contextlib.ExitStack() as stack:
        if not address:
            # The job's own Ray keeps its sessions and sockets here. The bootstrap gives each job its own TMPDIR.
            env["TMPDIR"] = stack.enter_context(
                tempfile.TemporaryDirectory(
                    prefix="ngjob-", dir=temp_parent(tempfile.gettempdir()), ignore_cleanup_errors=True
                )
            )
        outcome_file = environ.get("NG_OUTCOME_FILE")
        if not outcome_file:
            return run_trainer(argv, env, job.cluster.stop_grace_s)
        lines: list[str] = []
        try:
            return run_trainer(argv, env, job.cluster.stop_grace_s, report=lines.append)
        finally:  # the bootstrap prints these last, after it has stopped Ray
            Path(outcome_file).write_text("".join(f"launch: {line}\n" for line in lines))


if __name__ == "__main__":
    sys.exit(main())
