# SPDX-License-Identifier: Apache-2.0
"""The main job on CPU: verl's unmodified `python -m verl.trainer.main_ppo` with this plugin, as a subprocess.

`run_job(spec)` composes the command a user runs on a GPU cluster (`plugin_overrides`: GRPO, the plugin's
manager and dataset, the environment blend) with the CPU backend's overrides and environment (`overrides.py`),
starts it, and returns once it exits, with verl's own per-step metrics (verl's `file` logger, JSONL). While it
runs, the console shows only what a user looks at: the manager's progress lines and one summary line per step
(reward per environment, loss, failures, rollout and packing time) built from those metrics; verl's full
console output goes to `main_ppo.log` and NeMo Gym's server logs to `nemo_gym_logs/`, both under the output
folder. `write_reward_plot` draws the reward of each environment per step.

What a user meets when something goes wrong:
- A failed run ends with its cause on the console (`recipe.nemo_gym.failure_cause`: the innermost exception of the
  trainer's last traceback, whichever process raised it) and the log file for the rest.
- One job per output folder (`hold_output_folder`): a second job on a folder in use fails at once, naming the
  other job's PID, before it writes anything there.
- SIGINT or SIGTERM (Ctrl-C) stops the trainer the way verl stops: the trainer gets SIGINT and `STOP_GRACE_S`
  to exit before its process group is killed; the job's exit status is then 128 + the signal's number (130 for
  Ctrl-C), and so is that of a trainer killed by a signal.
- Each run gets a temporary folder of its own (`TMPDIR` of every process of the trainer: Ray's session folder,
  vLLM's sockets, wandb's and our backend's folders, verl's checkpoint locks), removed when the run has ended,
  whether it passed, failed or was stopped; what vLLM and verl leave in `/dev/shm` is removed too (`leftovers`).

Nothing here is a stand-in for verl or NeMo Gym: the trainer, its Ray workers, FSDP, checkpointing, the manager,
NeMo Gym's servers and environments, verl's vLLM rollout and vLLM's engine (its CPU build) are the real ones.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipe.nemo_gym.failure_cause import failure_cause
from recipe.nemo_gym.gym.owned.launch import RAY_START_TIMEOUT
from recipe.nemo_gym.leftovers import remove_leftovers
from recipe.nemo_gym.process_group import signal_group, stop_group
from recipe.nemo_gym_testing.cpu_policy import harness
from recipe.nemo_gym_testing.cpu_training import SCRIPT_ENV, SCRIPTED_PROCESSOR
from recipe.nemo_gym_testing.cpu_training.overrides import cpu_env, cpu_overrides

REPO_ROOT = Path(__file__).resolve().parents[3]
PROGRESS_MARKER = "NeMo Gym rollout:"
"""Lines the manager logs while a batch runs; the job echoes them to the console."""
STOP_GRACE_S = 30.0
"""How long a trainer sent SIGINT (the job was stopped by a signal) has to exit before its process group is killed."""
LOCK_FILE = ".job.lock"


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
    trainer_module: str = "verl.trainer.main_ppo"
    """What `python -m` runs. Only the tests of the runner's own semantics change it (`stand_in_trainer.py`)."""

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
    """The trainer's, as `subprocess` gives it: negative when a signal killed it."""
    elapsed_s: float
    steps: list[dict[str, Any]] = field(default_factory=list)
    """verl's logged metrics, one dict per logged step (`step` included), in order."""
    stopped_by: int | None = None
    """The signal that stopped the job itself (SIGINT, SIGTERM), if one did."""
    cause: str | None = None
    """What the trainer died of, from its log (`failure_cause`), when it failed."""

    @property
    def exit_status(self) -> int:
        """The job's exit status as a shell reports it: 128 + N for a signal N (the job's or the trainer's)."""
        if self.stopped_by is not None:
            return 128 + self.stopped_by
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def metric(self, name: str) -> list[Any]:
        return [s["data"].get(name) for s in self.steps]


class OutputFolderInUse(RuntimeError):
    """Another job holds the output folder; nothing of this job was written there."""


_held_folders: set[Path] = set()


@contextlib.contextmanager
def hold_output_folder(out_dir: Path) -> Iterator[Path]:
    """Hold `out_dir` for this process's job (an exclusive `flock` on `<out_dir>/.job.lock`, which records the PID;
    the kernel releases it when the process ends, however it ends). Re-entrant within the process. Raises
    `OutputFolderInUse` naming the other job's PID when another process holds it."""
    out_dir = Path(out_dir).resolve()
    if out_dir in _held_folders:
        yield out_dir
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise OutputFolderInUse(
                f"{out_dir} is in use by another job (PID {other}); wait for it to end, stop it, or give this job "
                "another output folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held_folders.add(out_dir)
        try:
            yield out_dir
        finally:
            _held_folders.discard(out_dir)
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


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


def main_ppo_command(spec: JobSpec, temp_dir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the trainer process: the plugin's overrides, then the CPU backend's; `temp_dir`
    becomes the `TMPDIR` of all its processes."""
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    agent_loop_config = _agent_loop_config_with_logs(spec)
    argv = [sys.executable, "-m", spec.trainer_module]
    argv += plugin_overrides(spec, agent_loop_config) + cpu_overrides() + list(spec.extra_overrides)
    argv.append(f"hydra.run.dir={spec.out_dir / 'hydra'}")
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses an empty one; there is no GPU to hide anyway
    env.update(cpu_env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["VERL_FILE_LOGGER_PATH"] = str(spec.metrics_file)
    env["PYTHONUNBUFFERED"] = "1"
    if temp_dir is not None:
        env["TMPDIR"] = str(temp_dir)  # Ray's session folder goes here too (on Linux Ray reads TMPDIR ...
        env.pop("RAY_TMPDIR", None)  # ... unless RAY_TMPDIR is set, which would win)
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


# Ray 2.60 gives a new local node a fixed 30 s to register with its GCS (`RAY_START_TIMEOUT`, the message NeMo
# Gym's start retries on too); on a 2-core machine busy with other work it sometimes misses that, before verl has
# done anything.


def run_job(spec: JobSpec, console: Callable[[str], None] = print, timeout_s: float = 3600.0) -> JobResult:
    """Run `main_ppo` to completion (bounded by `timeout_s`: then its process group is killed), holding the output
    folder. A run that failed only because Ray's local node missed its start-up deadline is started once more,
    saying so. A failed run's cause ends the console output (see the module docstring)."""
    with hold_output_folder(spec.out_dir):
        result, log_text = _run_once(spec, console, timeout_s, append=spec.resume)
        if result.stopped_by is None and missed_ray_start(result, log_text):
            console(f"main_ppo: Ray's local node missed its 30 s start-up deadline ({RAY_START_TIMEOUT!r}); once more")
            result, _ = _run_once(spec, console, timeout_s, append=True)
    for line in outcome_lines(result, spec.log_file):
        console(line)
    return result


def outcome_lines(result: JobResult, log_file: Path) -> list[str]:
    """What the console ends with: nothing for a run that passed; otherwise how it ended and why, then the log."""
    took = f"after {result.elapsed_s:.0f} s"
    if result.stopped_by is not None:
        name = signal.Signals(result.stopped_by).name
        return [f"main_ppo stopped by {name} {took} (exit status {result.exit_status}); log: {log_file}"]
    if result.returncode == 0:
        return []
    if result.returncode < 0:
        how = f"was killed by {signal.Signals(-result.returncode).name} {took} (exit status {result.exit_status})"
    else:
        how = f"failed with exit status {result.returncode} {took}"
    lines = [f"main_ppo {how}" + (":" if result.cause else "; the log shows no Python exception")]
    lines += [f"  {line}" for line in (result.cause or "").splitlines()]
    lines.append(f"full log: {log_file}")
    return lines


def missed_ray_start(result: JobResult, log_text: str) -> bool:
    """The run failed before any step, with Ray's start-up deadline message in its output."""
    return result.returncode != 0 and not result.steps and RAY_START_TIMEOUT in log_text


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: Any) -> None:
    raise _Stopped(signum)


@contextlib.contextmanager
def _signals_raise_stopped() -> Iterator[None]:
    """SIGINT and SIGTERM raise `_Stopped` in the main thread while the trainer runs (elsewhere: left alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_once(spec: JobSpec, console: Callable[[str], None], timeout_s: float, append: bool) -> tuple[JobResult, str]:
    temp_dir = Path(tempfile.mkdtemp(prefix="ngjob-"))  # short: Ray's socket paths live under it
    argv, env = main_ppo_command(spec, temp_dir)
    # verl's file logger truncates the file when it opens it: it only ever holds this run's steps.
    spec.metrics_file.unlink(missing_ok=True)
    (spec.out_dir / "command.sh").write_text(shlex.join(argv) + "\n")
    console(f"main_ppo: full log {spec.log_file}; NeMo Gym server logs {spec.nemo_gym_log_dir}/")
    started_at = time.time()  # wall clock: what leftovers compares file times with
    started = time.monotonic()
    shown: set[int] = set()
    head: list[str] = []  # the start-up phase: all the retry decision reads
    tail: collections.deque[str] = collections.deque(maxlen=5000)  # the end: where a failure's traceback is
    stopped_by: int | None = None
    with open(spec.log_file, "a" if append else "w", buffering=1) as log, _signals_raise_stopped():
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
        timer = threading.Timer(timeout_s, signal_group, args=(proc.pid, signal.SIGKILL))
        timer.start()
        try:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    log.write(f"[{time.monotonic() - started:7.1f}s] {line}")  # where a slow start-up spends its time
                    if len(head) < 400:
                        head.append(line)
                    tail.append(line)
                    if PROGRESS_MARKER in line:
                        console(progress_text(line))
                    for step in _read_steps(spec.metrics_file):
                        if step["step"] not in shown:
                            shown.add(step["step"])
                            console(format_step(step))
                proc.wait()
            except _Stopped as stop:
                stopped_by = stop.signum
                console(
                    f"main_ppo: {signal.Signals(stop.signum).name} received; stopping the trainer (SIGINT, then "
                    f"SIGKILL after {STOP_GRACE_S:.0f} s)"
                )
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # one stop at a time; it is bounded
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                _stop_trainer(proc, log, STOP_GRACE_S)
        finally:
            timer.cancel()
            if proc.poll() is None:
                signal_group(proc.pid, signal.SIGKILL)
            # Whatever of the trainer's group is left (Ray's and vLLM's processes) gets 30 s to exit, then SIGKILL.
            stop_group(proc.pid, 30.0, first=None)
            for path in remove_leftovers(started_at):
                log.write(f"job runner: removed {path} (left by vLLM or verl, held by no process)\n")
            shutil.rmtree(temp_dir, ignore_errors=True)
    steps = _read_steps(spec.metrics_file)
    for step in steps:
        if step["step"] not in shown:
            console(format_step(step))
    cause = None
    if proc.returncode != 0 and stopped_by is None:
        found = failure_cause("".join(tail))
        cause = str(found) if found is not None else None
    result = JobResult(
        returncode=proc.returncode,
        elapsed_s=time.monotonic() - started,
        steps=steps,
        stopped_by=stopped_by,
        cause=cause,
    )
    return result, "".join(head)


def _stop_trainer(proc: subprocess.Popen, log: Any, grace_s: float) -> None:
    """SIGINT to the trainer (verl's driver: it stops its Ray job and Ray its workers), then its process group
    killed after `grace_s` if anything of it is left."""
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)
    # Drain what the trainer prints while it stops (its pipe would otherwise fill and block it).
    drain = threading.Thread(target=_copy_lines, args=(proc.stdout, log), daemon=True)
    drain.start()
    try:
        proc.wait(timeout=grace_s)
        how = f"the trainer stopped {time.monotonic() - started:.1f} s after SIGINT"
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        how = f"the trainer did not stop within {grace_s:.0f} s of SIGINT; its process group was killed"
    drain.join(timeout=5.0)
    log.write(f"job runner: {how}\n")


def _copy_lines(source: Any, log: Any) -> None:
    with contextlib.suppress(ValueError, OSError):  # the pipe or the log closed under it
        for line in source:
            log.write(line)


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
    # verl's core validation variable: the plugin's `acc` (the reward over episodes that did not fail).
    vals = {k.split("/")[1]: v for k, v in data.items() if k.startswith("val-core/") and "/acc/" in k}
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


def spec_to_json(spec: JobSpec) -> str:
    """`spec` as JSON, for `python -m recipe.nemo_gym_testing.cpu_training.job SPEC.json`."""
    return json.dumps({key: _plain(value) for key, value in spec.__dict__.items()}, indent=1)


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def spec_from_json(text: str) -> JobSpec:
    """A `JobSpec` from JSON; relative paths are taken from the current directory (every process of the job, Ray's
    workers included, gets absolute ones)."""
    raw = json.loads(text)
    paths = ("out_dir", "model_dir", "agent_loop_config", "script_file")
    for key in paths:
        if raw.get(key) is not None:
            raw[key] = Path(raw[key]).resolve()
    for key in ("train_files", "val_files"):
        raw[key] = [Path(p).resolve() for p in raw[key]]
    raw["extra_overrides"] = tuple(raw.get("extra_overrides", ()))
    return JobSpec(**raw)


def main(argv: Sequence[str]) -> int:
    """Run the job a JSON spec file describes, as a user's job runs: console on stdout, exit status the job's."""
    if len(argv) != 1:
        print("usage: python -m recipe.nemo_gym_testing.cpu_training.job SPEC.json", file=sys.stderr)
        return 2
    spec = spec_from_json(Path(argv[0]).read_text())
    try:
        result = run_job(spec, console=lambda line: print(line, flush=True))
    except OutputFolderInUse as e:
        print(f"job: {e}", flush=True)
        return 1
    if result.exit_status == 0:  # a failed or stopped run has already said how it ended (`outcome_lines`)
        print(f"main_ppo finished in {result.elapsed_s:.0f} s; metrics: {spec.metrics_file}; log: {spec.log_file}")
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
