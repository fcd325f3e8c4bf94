# SPDX-License-Identifier: Apache-2.0
"""The plugin's settings: one YAML file, the environments file, validated once into `NeMoGymConfig`.

A job names it as `environments` (`launch/job.py`); verl receives it as `actor_rollout_ref.rollout.agent
.agent_loop_config_path`. The launcher validates it with `load_config` before anything starts (`launch check`), and
the manager loads the same file with the same function in verl's TaskRunner.

Contract:
- `${VAR}` / `$VAR` in any string value is expanded from the environment; a variable that is not set is an
  `UnsetVariable` error naming the key (a silent literal "${DATA}" path fails much later and much less clearly).
- Unknown keys are rejected by name, at start-up, before any server starts.
- NeMo Gym runs from its own Python environment (`nemo_gym.environment`; unset: `$NEMO_GYM_ENV`, else the
  `.venv-gym` that `./setup.sh` builds), as a process tree of its own; see `gym/environment.py`. With
  `nemo_gym.attach`, the plugin uses a Gym started elsewhere instead (`gym/attach.py`), and the settings of a Gym it
  would start are refused by name.
- NeMo Gym config paths are relative to `nemo_gym.root` when it is set; otherwise they resolve as NeMo Gym
  resolves them, against the current directory first, then the directory holding the `nemo_gym` package of
  Gym's environment (its site-packages), so a pip-installed NeMo Gym needs no clone.
- Every default and every rule of a setting lives here, and the validated models are what the rest of the plugin
  is handed (`gym/connect.py`): there is no second description of a Gym to keep in step with this one.

Example (see recipe/nemo_gym/configs/ for the shipped ones)::

    nemo_gym:
      config_paths:
        - responses_api_models/vllm_model/configs/vllm_model_for_training.yaml
        - resources_servers/math_with_judge/configs/math_with_judge.yaml
      uses_reasoning_parser: false
    timeouts:
      batch_s: 3600
    failures:
      max_fraction: 0.05
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recipe.nemo_gym.errors import ConfigError

_VAR = re.compile(r"\$(\w+)|\$\{([^}]+)\}")


class UnsetVariable(ConfigError):
    """A `${VAR}` of the environments file names a variable this process's environment does not set."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeadServer(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=11000, ge=1, le=65535)


class Attach(_Strict):
    """A NeMo Gym someone else started (other nodes, another Slurm job): the plugin starts and stops nothing of it,
    and hands it verl's policy address through the `endpoint_file` of its policy model server (Gym 0.7's
    `vllm_model`). See `gym/attach.py`."""

    head_server_url: str = Field(pattern=r"^http://[^/:]+(:\d+)?/?$")
    """The attached Gym's head server, e.g. `http://gym-node:11000`."""
    policy_model_server: str = "policy_model"
    """The Gym model server that serves the policy being trained (`vllm_model_for_training.yaml` names it so)."""
    endpoint_file: Path | None = None
    """The endpoint file as this trainer's nodes see it. Unset: the path the model server's config names (the
    same path on both sides of a shared file system)."""
    relay_host: str | None = None
    """With several verl policy servers, the address Gym reaches this trainer's policy relay at. Unset: the IP
    address of the node the trainer runs on."""
    relay_port: int = Field(default=0, ge=0, le=65535)
    """The relay's port; 0 picks a free one."""


POLICY_JUDGE = "policy"


class Judge(_Strict):
    """The LLM judge of every resources server the plugin starts that names one (`judge_model_server`): one model
    server for the whole Gym (`gym/owned/judge.py`). `judge: policy` is short for `judge: {base_url: policy}`."""

    base_url: str | list[str] = Field(min_length=1)
    """`policy`: verl's own vLLM servers, found as the policy's are. Otherwise the OpenAI-compatible base URL (or
    URLs) of the judge's server, e.g. `http://judge-node:8000/v1`, which must serve `/v1/chat/completions`."""
    model: str | None = None
    """The judge's model name as its server serves it. Required with a URL; with `policy`, the policy's."""
    api_key: str | None = None
    """The key the judge's server takes. Unset: `EMPTY` for a URL, `nemo_gym.policy_api_key` for `policy`."""
    uses_reasoning_parser: bool | None = None
    """Whether the judge's server runs a reasoning parser. Unset: `nemo_gym.uses_reasoning_parser` for `policy`,
    false for a URL."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Merged into every request the judge's server is sent (e.g. `chat_template_kwargs`)."""
    exclude_servers: list[str] = Field(default_factory=list)
    """Resources servers that keep the judge their own config names (e.g. a safety classifier's own model)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"base_url": value} if isinstance(value, str) else value

    @field_validator("base_url")
    @classmethod
    def _urls(cls, value: str | list[str]) -> str | list[str]:
        urls = [value] if isinstance(value, str) else value
        if urls == [POLICY_JUDGE]:
            return value
        bad = [url for url in urls if not re.match(r"^https?://[^/\s]+", url)]
        if bad:
            raise ValueError(f"expected {POLICY_JUDGE!r} or http(s) base URLs of the judge's server, got {bad}")
        return value

    @model_validator(mode="after")
    def _model_for_url(self) -> Judge:
        if not self.is_policy and not self.model:
            raise ValueError("judge.model is required with a judge URL (the model name the judge's server serves)")
        return self

    @property
    def is_policy(self) -> bool:
        return self.base_url in (POLICY_JUDGE, [POLICY_JUDGE])

    @property
    def base_urls(self) -> list[str]:
        """The judge's own URLs (empty for `policy`: verl's servers, known only at start-up)."""
        if self.is_policy:
            return []
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)


MAX_REPLICAS = 64
MAX_COLLECT_PROCESSES = 64

# Settings of the NeMo Gym the plugin starts; an attached Gym runs its own configuration.
START_ONLY_KEYS = (
    "environment",
    "root",
    "config_paths",
    "config_overrides",
    "head_server",
    "policy_api_key",
    "uses_reasoning_parser",
    "venv_dir",
    "log_dir",
    "replicas",
    "judge",
)


# Keys of NeMo Gym's global config that the plugin sets itself (`gym/owned/global_config.py`), from this file's other
# settings and from the policy servers verl runs: `config_overrides` may not set them.
PLUGIN_SET_GYM_KEYS = frozenset(
    {
        "config_paths",
        "policy_base_url",
        "policy_api_key",
        "policy_model_name",
        "head_server",
        "ray_head_node_address",
        "skip_venv_if_present",
        "uv_venv_dir",
        "uv_cache_dir",
        "nemo_gym_log_dir",
    }
)


class NeMoGymSection(_Strict):
    attach: Attach | None = None
    """Use a NeMo Gym started elsewhere instead of starting one (its settings exclude every setting below)."""
    environment: Path | None = None
    """The Python environment NeMo Gym runs from (a venv folder or its Python). Unset: `$NEMO_GYM_ENV`, else
    `<repository>/.venv-gym`. Its nemo-gym release (0.4.x or 0.7.x) is read from it at start-up."""
    root: Path | None = None
    """NeMo Gym's root; relative `config_paths` resolve against it. Unset: NeMo Gym's own rule (the current
    directory, then the installed package's parent)."""
    config_paths: list[str] = Field(default_factory=list)
    """The training model server config plus one config per environment (at least one, unless `attach`)."""
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    """Extra keys merged into NeMo Gym's global config dict (deep-merged; e.g. to turn a judge off)."""
    head_server: HeadServer = HeadServer()
    policy_api_key: str = "EMPTY"
    uses_reasoning_parser: bool = False
    """Must match whether verl's vLLM servers run a reasoning parser."""
    venv_dir: Path | None = None
    """Where per-server `.venv` links to the running environment are made. Default: a folder per Gym interpreter in
    `nemo_gym_venvs` under the plugin's cache folder (`$NEMO_GYM_VERL_CACHE`, else `~/.cache/verl-nemo-gym`). A folder
    given here serves one Gym environment: two stacks with different ones need two."""
    log_dir: Path | None = None
    replicas: dict[str, int] = Field(default_factory=dict)
    """Agents to run as several copies, `{<agent>: K}`: K copies of the agent, each with its own copy of its
    resources server (and of an environment server in front of it), and rows naming the agent spread over them,
    fewest episodes in flight first (`gym/replicas.py`). Rows, data files and metrics still name the agent."""

    judge: Judge | None = None
    """The LLM judge of the resources servers that name one (`judge_model_server`). Unset: each keeps the judge its
    config names, and one that names a model server no config defines is an error at start, naming it."""

    collect_processes: int = Field(default=0, ge=0, le=MAX_COLLECT_PROCESSES)
    """Child processes of the manager that post rows to Gym and read results into episodes
    (`gym/over_http/collect_processes.py`). 0: the manager's own event loop does it. They are for long results
    (multi-turn episodes, whose JSON they parse) and many calls; on short episodes they cost more CPU than they take
    off the manager (benchmarks/README.md)."""

    @field_validator("replicas")
    @classmethod
    def _replica_counts(cls, value: dict[str, int]) -> dict[str, int]:
        bad = [f"{agent}: {count}" for agent, count in value.items() if not 1 <= count <= MAX_REPLICAS]
        if bad:
            raise ValueError(f"each agent runs 1 to {MAX_REPLICAS} copies; got {', '.join(bad)}")
        return value

    @field_validator("config_overrides")
    @classmethod
    def _no_plugin_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(PLUGIN_SET_GYM_KEYS & set(value))
        if clash:
            raise ValueError(
                f"sets {clash}, which the plugin sets itself (from nemo_gym's other keys and verl's servers)"
            )
        return value

    @model_validator(mode="after")
    def _start_or_attach(self) -> NeMoGymSection:
        if self.attach is None:
            if not self.config_paths:
                raise ValueError(
                    "config_paths is empty: name the NeMo Gym configs to start (the training model server's and one "
                    "per environment), or set nemo_gym.attach to use a NeMo Gym started elsewhere"
                )
            return self
        clash = [key for key in START_ONLY_KEYS if key in self.model_fields_set]
        if clash:
            raise ValueError(
                f"{', '.join(clash)} configure the NeMo Gym the plugin starts; with nemo_gym.attach the attached Gym "
                "runs its own configuration: remove them, or remove nemo_gym.attach"
            )
        return self

    def rooted_config_paths(self) -> list[str]:
        """`config_paths` as NeMo Gym is handed them: relative ones made absolute under `root` when it is set."""
        if self.root is None:
            return list(self.config_paths)
        return [p if Path(p).is_absolute() else str(self.root / p) for p in self.config_paths]


class Timeouts(_Strict):
    startup_s: float = Field(default=600.0, gt=0)
    """Deadline for every NeMo Gym server to answer its health check after start."""
    batch_s: float = Field(default=3600.0, gt=0)
    """Deadline for one `generate_sequences` call; past it the step fails, naming how many episodes were pending."""
    health_check_interval_s: float = Field(default=10.0, gt=0)
    """How often the servers are checked while a batch waits."""
    shutdown_grace_s: float = Field(default=10.0, gt=0)
    policy_health_timeout_s: float = Field(default=10.0, gt=0)
    """A policy server's `GET /health` must answer within this while a batch waits."""
    policy_health_failures: int = Field(default=3, ge=1)
    """This many unanswered policy health checks in a row abort the batch, naming the server."""


class Failures(_Strict):
    max_fraction: float = Field(default=0.05, ge=0.0, le=1.0)
    """Share of a batch's episodes that may fail (masked, reward 0) before the step fails, rounded up to whole
    episodes: a batch of B tolerates ceil(max_fraction x B) failures, so at least one when max_fraction > 0. It
    counts what still fails after the retries."""
    retries: int = Field(default=1, ge=0)
    """An episode that failed for an infrastructure cause (an HTTP error from its agent, a dropped connection, a
    failure Gym reports on its row) is run again, in the same step, up to this many times, within the batch's
    deadline. Data causes and the environment's own `mask_sample` verdict are never retried."""
    retry_delay_s: float = Field(default=1.0, ge=0.0)
    """Wait before each retry of an episode."""
    min_valid_per_group: int = Field(default=2, ge=1)
    """With a failure-aware estimator (`algorithm.adv_estimator=nemo_gym_grpo`, ...; `advantages.py`): a group of
    samples of one prompt that failures leave with fewer valid episodes than this gets advantage 0 on every row."""


class Data(_Strict):
    check_rows: bool = True
    """Before step 1, read every row of verl's `data.train_files` and `data.val_files` and refuse the run listing
    every row that cannot be trained on, by file and line (`data_check.py`). Turn off only for files too large
    to read at start-up; a bad row then stops the run at the step that reads it."""


class NeMoGymConfig(_Strict):
    nemo_gym: NeMoGymSection
    timeouts: Timeouts = Timeouts()
    failures: Failures = Failures()
    data: Data = Data()

    @field_validator("nemo_gym", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("the nemo_gym section is empty")
        return value


def expand_env(value: Any, key: str = "") -> Any:
    """Expand environment variables in every string of a parsed YAML tree; unset variables are errors."""
    if isinstance(value, dict):
        return {k: expand_env(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def substitute(match: re.Match) -> str:
            name = match.group(1) or match.group(2)
            if name not in os.environ:
                raise UnsetVariable(f"{key}: environment variable {name!r} is not set (value {value!r})")
            return os.environ[name]

        return _VAR.sub(substitute, value)
    return value


def load_config(path: str | os.PathLike) -> NeMoGymConfig:
    """Read, expand and validate the environments file; every error names the file and the offending key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"the environments file {path} does not exist") from e
    except OSError as e:
        raise ConfigError(f"cannot read the environments file {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return NeMoGymConfig.model_validate(expand_env(raw))
    except UnsetVariable as e:
        raise UnsetVariable(f"{path}: {e}") from e
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '<top>'}: {err['msg']}" for err in e.errors(include_url=False)
        )
        raise ConfigError(f"{path}: {problems}") from e
