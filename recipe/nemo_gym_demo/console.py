# SPDX-License-Identifier: Apache-2.0
"""A CPU job on this machine through the launcher, with the console the demo shows.

`write_job(spec)` writes `<out>/job.yaml`, a job file of the launcher (`backend: cpu`, `recipe/nemo_gym/launch/`),
and the environments file it names; `run_job(spec)` runs `python -m recipe.nemo_gym.launch run <out>/job.yaml` (which
checks the job, composes verl's command, runs `main_ppo` and supervises it) and returns once it has ended, with
verl's own per-step metrics (verl's `file` logger, JSONL). Nothing here composes verl's arguments or supervises the
trainer: the launcher does both, for this console as for a Slurm job.

What this module adds is what a user at a terminal looks at (`view.ConsoleView`). The trainer's whole output goes
to `<out>/main_ppo.log` (each line after the seconds since the start) and NeMo Gym's server logs to
`<out>/nemo_gym_logs/`; the console shows the launcher's own lines (`launch: ...`: its checks, a signal received, how
the run ended and, when the trainer failed, its error), the manager's progress lines and one summary line per step
(reward per environment, loss, failures, rollout and packing time) built from the metrics, within a second of verl
logging the step. `plot.write_reward_plot` draws the reward of each environment per step. Also:
- One job per output folder (`hold_output_folder`): a second job on a folder in use fails at once, naming the
  other job's PID, before it writes anything there.
- SIGINT or SIGTERM to this process (Ctrl-C) is passed on to the launcher, which stops the trainer the way verl
  stops; the exit status is the launcher's (130 for Ctrl-C).
- A run that failed before any step only because Ray's local node missed its fixed 30 s start-up deadline (a
  2-core machine busy with other work) is started once more, saying so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.launch.compose import TRAINER_MODULE
from recipe.nemo_gym.ports import pick_free_port
from recipe.nemo_gym.ray_start import RAY_START_TIMEOUT, missed_ray_start
from recipe.nemo_gym_demo.view import ConsoleView

REPO_ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 30
"""The job's `cluster.stop_grace_s`: how long a stopped trainer has to exit before its process group is killed."""
LOCK_FILE = ".job.lock"


@dataclass(frozen=True)
class JobSpec:
    """A CPU job in the few keys the demo and the tests set; `write_job` turns it into the launcher's job file."""

    out_dir: Path
    model_dir: Path
    environments_file: Path
    """The environments file; copied into `out_dir` with NeMo Gym's log folder and head server port set."""
    train_files: Sequence[Path]
    val_files: Sequence[Path]
    steps: int
    batch_size: int
    """Prompts per step, all in one PPO mini-batch."""
    n: int
    prompt_length: int
    response_length: int
    lr: float = 1e-6
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = True
    resume: bool = False
    seed: int = 1
    head_port: int | None = None
    """NeMo Gym's head server port; None picks a free one, so the job never collides with another on 11000."""
    extra_overrides: Sequence[str] = ()
    """More Hydra overrides for `main_ppo` (the job's `verl_overrides`, after this spec's own)."""
    trainer_module: str = TRAINER_MODULE
    """What the launcher's `python -m` runs. Only the tests of the launcher's own semantics change it
    (`tests/support/stand_in_trainer.py`, through the launcher's `NG_TRAINER_MODULE`)."""

    @property
    def job_file(self) -> Path:
        return self.out_dir / "job.yaml"

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
    exit_status: int
    """The launcher's, as a shell reports it: 128 + N when a signal N stopped the job or killed the trainer."""
    elapsed_s: float
    steps: list[dict[str, Any]] = field(default_factory=list)
    """verl's logged metrics, one dict per logged step (`step` included), in order."""
    outcome: list[str] = field(default_factory=list)
    """The launcher's last lines (`launch: ...`): how the run ended and, when the trainer failed, its error."""

    @property
    def cause(self) -> str | None:
        """A failed trainer's error as the launcher reported it, if it did."""
        for i, line in enumerate(self.outcome):
            if line.startswith("launch: the trainer failed") and line.endswith(":"):
                return "\n".join(rest.removeprefix("launch: ") for rest in self.outcome[i + 1 :])
        return None

    def metric(self, name: str) -> list[Any]:
        return [s["data"].get(name) for s in self.steps]


class OutputFolderInUse(ConfigError):
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


def job_keys(spec: JobSpec, environments: Path) -> dict[str, Any]:
    """The launcher's job (see `jobs/math.yaml` for every key) that `spec` describes, with `environments` as its
    environments file."""
    return {
        "backend": "cpu",
        "model": str(spec.model_dir),
        "checkpoint_dir": str(spec.checkpoint_dir),
        "environments": str(environments),
        "data": {"train_files": [str(p) for p in spec.train_files], "val_files": [str(p) for p in spec.val_files]},
        "cluster": {"gpus_per_node": 1, "stop_grace_s": STOP_GRACE_S},
        "training": {
            "train_batch_size": spec.batch_size,
            "rollout_n": spec.n,
            "ppo_mini_batch_size": spec.batch_size,
            "micro_batch_size_per_gpu": 1,
            "max_prompt_length": spec.prompt_length,
            "max_response_length": spec.response_length,
            "lr": spec.lr,
            "total_training_steps": spec.steps,
            "save_freq": spec.save_freq,
            "test_freq": spec.test_freq,
            "val_before_train": spec.val_before_train,
        },
        "logging": {"project": "nemo_gym_cpu", "experiment": spec.out_dir.name, "loggers": ["console", "file"]},
        "verl_overrides": [
            # n samples at temperature 1, greedy validation
            "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.rollout.val_kwargs.temperature=0.0",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            "algorithm.use_kl_in_reward=false",
            f"data.seed={spec.seed}",
            f"trainer.resume_mode={'auto' if spec.resume else 'disable'}",
            f"hydra.run.dir={spec.out_dir / 'hydra'}",
            *spec.extra_overrides,
        ],
    }


def write_job(spec: JobSpec) -> Path:
    """Write the environments file with NeMo Gym's log folder and head server port (`<out>/environments.yaml`: NeMo
    Gym's servers log to files, not the console), unless it attaches to a Gym started elsewhere, then the job file."""
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(spec.environments_file.read_text())
    if "attach" not in config["nemo_gym"]:  # an attached Gym logs and listens where it was started
        config["nemo_gym"]["log_dir"] = str(spec.nemo_gym_log_dir)
        config["nemo_gym"]["head_server"] = {"host": "127.0.0.1", "port": spec.head_port or pick_free_port()}
    environments = spec.out_dir / "environments.yaml"
    environments.write_text(yaml.safe_dump(config, sort_keys=False))
    spec.job_file.write_text(yaml.safe_dump(job_keys(spec, environments), sort_keys=False))
    return spec.job_file


def run_job(spec: JobSpec, console: Callable[[str], None] = print, timeout_s: float = 3600.0) -> JobResult:
    """Write the job and run it through the launcher, holding the output folder (see the module docstring). After
    `timeout_s` the launcher is sent SIGTERM (it stops the trainer, bounded by the job's grace)."""
    with hold_output_folder(spec.out_dir):
        write_job(spec)
        result, head = _run_once(spec, console, timeout_s, append=spec.resume)
        if trainer_missed_ray_start(result, head):
            console(f"main_ppo: Ray's local node missed its 30 s start-up deadline ({RAY_START_TIMEOUT!r}); once more")
            result, _ = _run_once(spec, console, timeout_s, append=True)
    if result.exit_status != 0:
        console(f"full log: {spec.log_file}")
    return result


def trainer_missed_ray_start(result: JobResult, start_up_output: str) -> bool:
    """The trainer failed before any step, with Ray's start-up deadline message in its output."""
    failed = result.exit_status != 0 and result.exit_status < 128  # not stopped by a signal
    return failed and not result.steps and missed_ray_start(start_up_output)


def launcher_command(spec: JobSpec) -> tuple[list[str], dict[str, str]]:
    """The launcher's argv and environment: verl's file logger writes the metrics where this console reads them."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["VERL_FILE_LOGGER_PATH"] = str(spec.metrics_file)
    env["PYTHONUNBUFFERED"] = "1"
    if spec.trainer_module != TRAINER_MODULE:
        env["NG_TRAINER_MODULE"] = spec.trainer_module
    return [sys.executable, "-m", "recipe.nemo_gym.launch", "run", str(spec.job_file)], env


def _read_into(pipe: Any, handle: Callable[[str], None]) -> None:
    with contextlib.suppress(ValueError, OSError):  # the pipe closed under it
        for line in pipe:
            handle(line)


@contextlib.contextmanager
def _signals_passed_on() -> Iterator[Callable[[subprocess.Popen], None]]:
    """SIGINT and SIGTERM to this process go to the launcher, which the caller names with the function this yields
    once it has started it (a signal that came before goes then). Installed before the launcher starts, so that it
    inherits the default dispositions, not an ignored SIGINT this process may have. A main thread's handlers only."""
    target: list[subprocess.Popen] = []
    pending: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if not target:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(target[0].pid, signum)

    def started(proc: subprocess.Popen) -> None:
        target.append(proc)
        for signum in pending[:1]:
            forward(signum, None)

    if threading.current_thread() is not threading.main_thread():
        yield lambda proc: None
        return
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield started
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_once(spec: JobSpec, console: Callable[[str], None], timeout_s: float, append: bool) -> tuple[JobResult, str]:
    argv, env = launcher_command(spec)
    # verl's file logger truncates the file when it opens it: it only ever holds this run's steps.
    spec.metrics_file.unlink(missing_ok=True)
    console(f"main_ppo: full log {spec.log_file}; NeMo Gym server logs {spec.nemo_gym_log_dir}/")
    started = time.monotonic()
    with open(spec.log_file, "a" if append else "w", buffering=1) as log:
        log.write(f"$ {' '.join(argv)}\n")
        view = ConsoleView(spec.metrics_file, console, log, started)
        with _signals_passed_on() as launcher_started:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=REPO_ROOT,  # relative NeMo Gym config and server paths (resources_servers/...) resolve here
                text=True,
                errors="replace",
                start_new_session=True,  # a terminal's Ctrl-C reaches it once, from here
            )
            launcher_started(proc)
            readers = [
                threading.Thread(target=_read_into, args=(proc.stdout, view.trainer_line), daemon=True),
                threading.Thread(target=_read_into, args=(proc.stderr, view.launcher_line), daemon=True),
            ]
            steps_stop = threading.Event()
            readers.append(threading.Thread(target=view.follow_steps, args=(steps_stop,), daemon=True))
            for reader in readers:
                reader.start()
            # The launcher ends its trainer within its grace once told to; SIGKILL only if it does not.
            stop = threading.Timer(timeout_s, proc.send_signal, args=(signal.SIGTERM,))
            kill = threading.Timer(timeout_s + 3 * STOP_GRACE_S + 60, proc.kill)
            stop.start()
            kill.start()
            try:
                proc.wait()
            finally:
                stop.cancel()
                kill.cancel()
                steps_stop.set()
                for reader in readers:  # only the launcher holds these pipes: they close with it
                    reader.join(timeout=10.0)
    with view.lock:
        view.show_new_steps()
    status = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    result = JobResult(status, time.monotonic() - started, view.steps.read, view.outcome)
    return result, "".join(view.head)


def spec_to_json(spec: JobSpec) -> str:
    """`spec` as JSON, for `python -m recipe.nemo_gym_demo.console SPEC.json`."""
    return json.dumps({key: _plain(value) for key, value in spec.__dict__.items()}, indent=1)


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def spec_from_json(text: str) -> JobSpec:
    """A `JobSpec` from JSON; relative paths are taken from the current directory."""
    raw = json.loads(text)
    for key in ("out_dir", "model_dir", "environments_file"):
        raw[key] = Path(raw[key]).resolve()
    for key in ("train_files", "val_files"):
        raw[key] = [Path(p).resolve() for p in raw[key]]
    raw["extra_overrides"] = tuple(raw.get("extra_overrides", ()))
    return JobSpec(**raw)


def main(argv: Sequence[str]) -> int:
    """Run the job a JSON spec file describes, as the demo runs its job: console on stdout, the launcher's status."""
    if len(argv) != 1:
        print("usage: python -m recipe.nemo_gym_demo.console SPEC.json", file=sys.stderr)
        return 2
    spec = spec_from_json(Path(argv[0]).read_text())
    try:
        result = run_job(spec, console=lambda line: print(line, flush=True))
    except OutputFolderInUse as e:
        print(f"job: {e}", flush=True)
        return 1
    if result.exit_status == 0:
        print(f"main_ppo finished in {result.elapsed_s:.0f} s; metrics: {spec.metrics_file}; log: {spec.log_file}")
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
