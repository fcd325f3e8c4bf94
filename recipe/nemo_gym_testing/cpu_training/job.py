# SPDX-License-Identifier: Apache-2.0
"""The main job on CPU: verl's unmodified `python -m verl.trainer.main_ppo` with this plugin, as a subprocess.

`run_job(spec)` composes the command a user runs on a GPU cluster (`plugin_overrides`: GRPO, the plugin's
manager and dataset, the environment blend) with the CPU backend's overrides and environment (`overrides.py`),
starts it, and returns once it exits, with verl's own per-step metrics (verl's `file` logger, JSONL). While it
runs, the console shows only what a user looks at: the manager's progress lines and one summary line per step
(reward per environment, loss, failures, rollout and packing time) built from those metrics; verl's full
console output goes to `main_ppo.log` and NeMo Gym's server logs to `nemo_gym_logs/`, both under the output
folder. `write_reward_plot` draws the reward of each environment per step.

Nothing here is a stand-in for verl or NeMo Gym: the trainer, its Ray workers, FSDP, checkpointing, the manager,
NeMo Gym's servers and environments, verl's vLLM rollout and vLLM's engine (its CPU build) are the real ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipe.nemo_gym.leftovers import remove_leftovers
from recipe.nemo_gym_testing.cpu_policy import harness
from recipe.nemo_gym_testing.cpu_training import SCRIPT_ENV, SCRIPTED_PROCESSOR
from recipe.nemo_gym_testing.cpu_training.overrides import cpu_env, cpu_overrides

REPO_ROOT = Path(__file__).resolve().parents[3]
PROGRESS_MARKER = "NeMo Gym rollout:"
"""Lines the manager logs while a batch runs; the job echoes them to the console."""


@dataclass(frozen=True)
class JobSpec:
    out_dir: Path
    model_dir: Path
    agent_loop_config: Path
    """The plugin YAML (`agent_loop_config_path`); copied into `out_dir` with NeMo Gym's log folder set."""
    train_files: Sequence[Path]
    val_files: Sequence[Path]
    steps: int
    batch_size: int
    n: int
    prompt_length: int
    response_length: int
    lr: float = 1e-6
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = True
    resume: bool = False
    script_file: Path | None = None
    """A `ScriptedPolicy` JSON: scripted turns forced inside vLLM's engine, log-probs the model's own
    (`scripted_logits.py`)."""
    seed: int = 1
    head_port: int | None = None
    """NeMo Gym's head server port; None picks a free one, so the job never collides with another on 11000."""
    extra_overrides: Sequence[str] = ()

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def metrics_file(self) -> Path:
        return self.out_dir / "metrics.jsonl"

    @property
    def log_file(self) -> Path:
        return self.out_dir / "main_ppo.log"

    @property
    def nemo_gym_log_dir(self) -> Path:
        return self.out_dir / "nemo_gym_logs"


@dataclass
class JobResult:
    returncode: int
    elapsed_s: float
    steps: list[dict[str, Any]] = field(default_factory=list)
    """verl's logged metrics, one dict per logged step (`step` included), in order."""

    def metric(self, name: str) -> list[Any]:
        return [s["data"].get(name) for s in self.steps]


def plugin_overrides(spec: JobSpec, agent_loop_config: Path) -> list[str]:
    """What a user passes to `main_ppo` to train with this plugin (sized by `spec`), device-independent."""
    files = lambda paths: "[" + ",".join(f"'{p}'" for p in paths) + "]"  # noqa: E731
    return [
        *harness.sized_overrides(
            spec.model_dir,
            agent_loop_config,
            prompt_length=spec.prompt_length,
            response_length=spec.response_length,
            n=spec.n,
            batch_size=spec.batch_size,
        ),
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"data.train_files={files(spec.train_files)}",
        f"data.val_files={files(spec.val_files)}",
        "data.dataloader_num_workers=0",
        f"data.seed={spec.seed}",
        f"actor_rollout_ref.actor.optim.lr={spec.lr}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false",
        "reward.num_workers=1",
        f"trainer.total_training_steps={spec.steps}",
        f"trainer.save_freq={spec.save_freq}",
        f"trainer.test_freq={spec.test_freq}",
        f"trainer.val_before_train={str(spec.val_before_train).lower()}",
        f"trainer.resume_mode={'auto' if spec.resume else 'disable'}",
        f"trainer.default_local_dir={spec.checkpoint_dir}",
        "trainer.logger=[console,file]",
        "trainer.project_name=nemo_gym_cpu",
        f"trainer.experiment_name={spec.out_dir.name}",
    ]


def main_ppo_command(spec: JobSpec) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the trainer process: the plugin's overrides, then the CPU backend's."""
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    agent_loop_config = _agent_loop_config_with_logs(spec)
    argv = [sys.executable, "-m", "verl.trainer.main_ppo"]
    argv += plugin_overrides(spec, agent_loop_config) + cpu_overrides() + list(spec.extra_overrides)
    argv.append(f"hydra.run.dir={spec.out_dir / 'hydra'}")
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses an empty one; there is no GPU to hide anyway
    env.update(cpu_env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["VERL_FILE_LOGGER_PATH"] = str(spec.metrics_file)
    env["PYTHONUNBUFFERED"] = "1"
    if spec.script_file is not None:
        argv += scripted_overrides(spec.script_file)
    return argv, env


def scripted_overrides(script_file: Path) -> list[str]:
    """What plays `script_file` inside verl's vLLM engine (`scripted_logits.py`): the logits processor, the script's
    path for the engine's processes, and log-probs of the raw logits (the model's own, before the processor)."""
    return [
        f"+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=['{SCRIPTED_PROCESSOR}']",
        "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{SCRIPT_ENV}='{script_file}'",
    ]


def _agent_loop_config_with_logs(spec: JobSpec) -> Path:
    """The plugin YAML with `nemo_gym.log_dir` set (NeMo Gym's servers log to files, not the console) and the
    job's head server port, unless it attaches to a Gym started elsewhere."""
    config = yaml.safe_load(spec.agent_loop_config.read_text())
    if "attach" not in config["nemo_gym"]:  # an attached Gym logs and listens where it was started
        config["nemo_gym"]["log_dir"] = str(spec.nemo_gym_log_dir)
        config["nemo_gym"]["head_server"] = {"host": "127.0.0.1", "port": spec.head_port or _free_port()}
    path = spec.out_dir / "agent_loop.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Ray 2.60 gives a new local node a fixed 30 s to register with its GCS (`ray/_private/node.py`, not
# configurable); on a 2-core machine busy with other work it sometimes misses that, before verl has done anything.
RAY_START_TIMEOUT = "The current node timed out during startup"


def run_job(spec: JobSpec, console: Callable[[str], None] = print, timeout_s: float = 3600.0) -> JobResult:
    """Run `main_ppo` to completion (bounded by `timeout_s`: then its process group is killed). A run that failed
    only because Ray's local node missed its start-up deadline is started once more, saying so."""
    result, log_text = _run_once(spec, console, timeout_s, append=spec.resume)
    if missed_ray_start(result, log_text):
        console(f"main_ppo: Ray's local node missed its 30 s start-up deadline ({RAY_START_TIMEOUT!r}); once more")
        result, _ = _run_once(spec, console, timeout_s, append=True)
    return result


def missed_ray_start(result: JobResult, log_text: str) -> bool:
    """The run failed before any step, with Ray's start-up deadline message in its output."""
    return result.returncode != 0 and not result.steps and RAY_START_TIMEOUT in log_text


def _run_once(spec: JobSpec, console: Callable[[str], None], timeout_s: float, append: bool) -> tuple[JobResult, str]:
    argv, env = main_ppo_command(spec)
    # verl's file logger truncates the file when it opens it: it only ever holds this run's steps.
    spec.metrics_file.unlink(missing_ok=True)
    (spec.out_dir / "command.sh").write_text(shlex.join(argv) + "\n")
    console(f"main_ppo: full log {spec.log_file}; NeMo Gym server logs {spec.nemo_gym_log_dir}/")
    started_at = time.time()  # wall clock: what leftovers compares file times with
    started = time.monotonic()
    shown: set[int] = set()
    this_run: list[str] = []
    with open(spec.log_file, "a" if append else "w", buffering=1) as log:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=REPO_ROOT,  # relative NeMo Gym config and server paths (resources_servers/...) resolve here
            text=True,
            errors="replace",
            start_new_session=True,
        )
        timer = threading.Timer(timeout_s, _kill_group, args=(proc,))
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(f"[{time.monotonic() - started:7.1f}s] {line}")  # where a slow start-up spends its time
                if len(this_run) < 400:  # the start-up phase is all the retry decision reads
                    this_run.append(line)
                if PROGRESS_MARKER in line:
                    console(progress_text(line))
                for step in _read_steps(spec.metrics_file):
                    if step["step"] not in shown:
                        shown.add(step["step"])
                        console(format_step(step))
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                _kill_group(proc)
            _wait_for_group_exit(proc.pid, timeout_s=30.0)
            for path in remove_leftovers(started_at):
                log.write(f"job runner: removed {path} (left by vLLM or verl, held by no process)\n")
    steps = _read_steps(spec.metrics_file)
    for step in steps:
        if step["step"] not in shown:
            console(format_step(step))
    result = JobResult(returncode=proc.returncode, elapsed_s=time.monotonic() - started, steps=steps)
    return result, "".join(this_run)


def _wait_for_group_exit(pgid: int, timeout_s: float) -> None:
    """Until no process of the trainer's process group is left (Ray's and vLLM's included), at most `timeout_s`;
    then what is still there is killed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, 9)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass


_RAY_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\([^)]*pid=\d+[^)]*\)(\x1b\[[0-9;]*m)?\s*")


# verl's log format in Ray workers: "WARNING:2026-11-23 16:18:43,651:<message>"
_LOG_PREFIX = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d [\d:,]+:")


def progress_text(line: str) -> str:
    """A worker's progress line as the console shows it: without Ray's process tag or the log record prefix."""
    return _LOG_PREFIX.sub("", _RAY_PREFIX.sub("", line.rstrip()))


def _read_steps(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line still being written
    return steps


def environments(data: dict[str, Any]) -> list[str]:
    """The environments a step's metrics report on (`timing_s/nemo_gym/<env>/episodes`), `all` excluded."""
    found = {m.group(1) for key in data if (m := re.fullmatch(r"timing_s/nemo_gym/(.+)/episodes", key))}
    return sorted(found - {"all"})


def format_step(step: dict[str, Any]) -> str:
    """One console line per logged step: what a user looks at, from verl's own metrics."""
    data = step["data"]
    gym = "timing_s/nemo_gym/"
    parts = [f"step {step['step']}"]
    vals = {k.split("/")[1]: v for k, v in data.items() if k.startswith("val-core/") and "/reward/" in k}
    if vals:
        parts.append("validation " + " ".join(f"{env}={v:.3f}" for env, v in sorted(vals.items())))
    rewards = [f"{env}={data[f'{gym}{env}/reward/mean']:.3f}" for env in environments(data)]
    if rewards:
        parts.append("reward " + " ".join(rewards))
    if "actor/pg_loss" in data:
        parts.append(f"loss {data['actor/pg_loss']:+.4f} grad_norm {data.get('actor/grad_norm', float('nan')):.3g}")
    if f"{gym}all/failed" in data:
        parts.append(f"failed {int(data[f'{gym}all/failed'])}/{int(data[f'{gym}all/episodes'])}")
    if f"{gym}rollout_wait" in data:
        parts.append(f"rollout {data[f'{gym}rollout_wait']:.1f}s packing {1e3 * data[f'{gym}packing']:.0f}ms")
    if "timing_s/step" in data:
        parts.append(f"step {data['timing_s/step']:.0f}s")
    return " | ".join(parts)


def write_reward_plot(steps: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Mean training reward of each environment per step, as a PNG; None when no step reported a reward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for step in steps:
        for env in environments(step["data"]):
            series.setdefault(env, []).append((step["step"], step["data"][f"timing_s/nemo_gym/{env}/reward/mean"]))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for env, points in sorted(series.items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=env)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward (training batch)")
    ax.set_title("NeMo Gym environments: reward per step (verl main_ppo, CPU)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
