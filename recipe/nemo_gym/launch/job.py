# SPDX-License-Identifier: Apache-2.0
"""A training job as one typed object: what a user writes in one YAML file, validated once.

`load_job(path, sets, environ)` reads the job file, applies overrides, and returns a `Job` or raises `JobError`
naming the file, the key and where the bad value came from. Overrides, later ones winning:

1. the job file itself;
2. environment variables `JOB__<KEY>`, with `__` between levels (`JOB__TRAINING__LR=3e-6`,
   `JOB__CLUSTER__NNODES=2`): what Slurm users set on `sbatch`'s command line or in their shell;
3. `--set key=value` on the launcher's command line (`--set training.lr=3e-6`).

An override's value is read as YAML (`2` is a number, `true` a boolean, `[a.jsonl, b.jsonl]` a list). Every key
is checked (an unknown key is an error, not ignored), and so is every value's type and range. Relative paths in the
file are taken from the file's folder; relative paths given as overrides from the current directory. Secrets are not
job keys: `WANDB_API_KEY` stays in the environment and is never printed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from recipe.nemo_gym.errors import ConfigError

ENV_PREFIX = "JOB__"

PositiveInt = Annotated[int, Field(gt=0)]
Port = Annotated[int, Field(gt=0, lt=65536)]


class JobError(ConfigError):
    """The job file or one of its overrides is not a valid job; the message names the file and key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobData(_Section):
    train_files: Annotated[list[Path], Field(min_length=1)]
    """NeMo Gym JSONL files: each row holds `responses_create_params.input` and `agent_ref.name`."""
    val_files: Annotated[list[Path], Field(min_length=1)]
    default_agent: str | None = None
    """The NeMo Gym agent for rows that name none (NeMo Gym's example data names none)."""


class Cluster(_Section):
    nnodes: PositiveInt = 1
    """Under Slurm, the allocation's node count (`sbatch --nodes`); without Slurm, 1."""
    gpus_per_node: PositiveInt = 8
    ray_num_cpus: PositiveInt | None = None
    """Logical CPUs each node's Ray announces. None: Ray counts the cores (gpu), 8 (cpu)."""
    ray_port: Port = 6379
    ray_dashboard_port: Port = 8265
    ray_client_server_port: Port = 10001
    """The head's Ray Client server (Ray's default; nothing of the job uses ray://, but Ray 2.60 cannot turn it off).
    Give each job on a shared node its own, as with `ray_port`: NeMo Gym's servers also draw ports from 10001-20000."""
    ray_join_timeout_s: PositiveInt = 600
    """How long every node has to join the Ray cluster."""
    ray_poll_interval_s: PositiveInt = 5
    ray_temp_dir: Path | None = None
    """Ray's session folder on the head node. None: in the job's temporary folder."""
    stop_grace_s: Annotated[int, Field(ge=0)] = 60
    """How long each process gets after SIGTERM (the trainer: SIGINT) before SIGKILL."""


class Training(_Section):
    strategy: Literal["fsdp", "megatron"] = "fsdp"
    megatron_tp: PositiveInt = 1
    megatron_pp: PositiveInt = 1
    train_batch_size: PositiveInt = 64
    """Prompts per step."""
    rollout_n: PositiveInt = 8
    """Episodes per prompt (the GRPO group)."""
    ppo_mini_batch_size: PositiveInt = 16
    micro_batch_size_per_gpu: PositiveInt = 2
    max_prompt_length: PositiveInt = 2048
    max_response_length: PositiveInt = 4096
    """Token budget of the whole multi-turn response."""
    lr: Annotated[float, Field(gt=0)] = 1e-6
    use_kl_loss: bool = False
    kl_loss_coef: Annotated[float, Field(ge=0)] = 0.001
    rollout_tp: PositiveInt = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.6
    tool_call_parser: str | None = "hermes"
    """vLLM's tool-call parser for the model's format (hermes: Qwen2.5/Qwen3). None: tool-free data only."""
    total_epochs: PositiveInt = 1
    total_training_steps: PositiveInt | None = None
    """A fixed number of steps, however many epochs of the data they take (`total_epochs` is then ignored)."""
    save_freq: int = 50
    """Checkpoint every this many steps; -1: never."""
    test_freq: int = 10
    val_before_train: bool = True


class Logging(_Section):
    project: str = "nemo_gym"
    experiment: str | None = None
    """None: the job file's name without `.yaml`."""
    loggers: list[str] | None = None
    """verl's `trainer.logger`. None: console, and wandb when `WANDB_API_KEY` is set."""


class Job(_Section):
    backend: Literal["gpu", "cpu"] = "gpu"
    """gpu: verl's vLLM rollouts and GPU training. cpu: the same trainer and plugin on machines without a GPU
    (a tiny model; for CI and for trying the scripts out)."""
    model: Path
    """A local Hugging Face model folder: vLLM serves it, FSDP or Megatron trains it."""
    checkpoint_dir: Path
    """verl's `trainer.default_local_dir`, on a file system every node sees."""
    environments: Path
    """The environments file: NeMo Gym's environments and agents (`recipe/nemo_gym/configs/`)."""
    data: JobData
    gym_env: Path | None = None
    """NeMo Gym's Python environment (Python 3.13), handed to the trainer as `$NEMO_GYM_ENV`. None: the environments
    file's `nemo_gym.environment`, else `$NEMO_GYM_ENV`, else `<repo>/.venv-gym` (built by ./setup.sh). Where both this
    and `nemo_gym.environment` are set they must name the same one (`launch check`)."""
    cluster: Cluster = Cluster()
    training: Training = Training()
    logging: Logging = Logging()
    verl_overrides: list[str] = []
    """More Hydra overrides for `main_ppo`, after the job's own (a key set twice takes the later value)."""
    name: str = Field(default="job", exclude=True)
    """The job file's name without `.yaml` (set by `load_job`, not a key of the file)."""

    @field_validator("verl_overrides")
    @classmethod
    def _overrides_are_key_value(cls, overrides: list[str]) -> list[str]:
        for item in overrides:
            if "=" not in item and not item.startswith("~"):
                raise ValueError(f"{item!r} is not a Hydra override (key=value)")
        return overrides

    @property
    def experiment(self) -> str:
        return self.logging.experiment or self.name


def load_job(path: str | os.PathLike, sets: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> Job:
    """The job in `path` with the environment's `JOB__*` variables and then `sets` (`key=value`) applied."""
    path = Path(path)
    environ = os.environ if environ is None else environ
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise JobError(f"cannot read the job file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise JobError(f"the job file {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise JobError(f"the job file {path} must hold a mapping of keys (backend, model, data, ...)")
    if "name" in raw:
        raise JobError(f"{path}: name: unknown key (a job is named after its file; set logging.experiment)")
    _resolve_paths(raw, path.resolve().parent)
    sources: dict[tuple[str, ...], str] = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX):
            keys = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
            _apply(raw, keys, environ[name], path)
            sources[keys] = f"the environment's {name}"
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobError(f"--set {item!r}: expected key=value, for example --set training.lr=3e-6")
        keys = tuple(key.split("."))
        _apply(raw, keys, value, path)
        sources[keys] = f"--set {key}"
    raw["name"] = path.name.removesuffix(".yaml").removesuffix(".yml")
    try:
        return Job.model_validate(raw)
    except ValidationError as e:
        raise JobError(_describe(e, path, sources)) from None


_PATH_KEYS = (("model",), ("checkpoint_dir",), ("environments",), ("gym_env",), ("cluster", "ray_temp_dir"))
_PATH_LIST_KEYS = (("data", "train_files"), ("data", "val_files"))


def _as_paths(keys: tuple[str, ...], value: Any, base: Path) -> Any:
    """`value` of `keys` with its paths made absolute from `base`; an empty path (or list item) means unset."""

    def one(item: Any) -> Any:
        return os.path.normpath(base / os.path.expanduser(item)) if isinstance(item, str) and item else item

    if keys in _PATH_KEYS:
        return one(value) if value != "" else None
    if keys in _PATH_LIST_KEYS:
        if isinstance(value, str):  # an override's `a.jsonl,b.jsonl`
            value = value.split(",")
        return [one(str(v)) for v in value if str(v)] if isinstance(value, list) else value
    return value


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Relative paths of the file, taken from the file's folder (overrides come later: from the current one)."""
    for keys in _PATH_KEYS + _PATH_LIST_KEYS:
        parent = raw
        for key in keys[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and keys[-1] in parent:
            parent[keys[-1]] = _as_paths(keys, parent[keys[-1]], base)


def _apply(raw: dict[str, Any], keys: tuple[str, ...], text: str, path: Path) -> None:
    """Set `keys` in `raw` to `text` read as YAML; an override into a key that is not a mapping is an error."""
    parent = raw
    for key in keys[:-1]:
        child = parent.setdefault(key, {})
        if not isinstance(child, dict):
            raise JobError(f"{path}: cannot set {'.'.join(keys)}: {key} is not a section")
        parent = child
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    if value is None and keys in _PATH_LIST_KEYS:
        value = []  # `JOB__DATA__VAL_FILES=` empties the list (then refused as too short, naming the key)
    parent[keys[-1]] = _as_paths(keys, value, Path.cwd())


def _describe(error: ValidationError, path: Path, sources: dict[tuple[str, ...], str]) -> str:
    lines = [f"the job file {path} is not a valid job:"]
    for item in error.errors():
        keys = tuple(str(k) for k in item["loc"])
        source = next((sources[keys[:n]] for n in range(len(keys), 0, -1) if keys[:n] in sources), None)
        where = f" (from {source})" if source else ""
        message = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        lines.append(f"  {'.'.join(keys)}: {message}{where}")
    return "\n".join(lines)
