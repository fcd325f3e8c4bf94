# SPDX-License-Identifier: Apache-2.0
"""What to start: `GymServersSpec`, and what a parsed NeMo Gym configuration holds: `ServerInstance`.

Contract:
- A `GymServersSpec` is valid once built: a bad field raises `GymConfigError` naming it. Every default and
  every rule a spec field shares with the plugin's YAML comes from the config model
  (`recipe.nemo_gym.config`: `HeadServer`, `NeMoGymSection`, `Timeouts`); only what the YAML does not carry
  (the policy servers verl found, the overrides' clash with the spec's own keys) is checked here.
- `GymServersSpec.from_config` maps the validated YAML to a spec; relative config paths are made absolute under
  `nemo_gym.root` by `NeMoGymSection.rooted_config_paths`, the rule the config model's own check uses too.
- `build_global_config_dict` is pure: the keys the plugin hands NeMo Gym (as the last config file it reads), the
  spec's keys over the overrides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from recipe.nemo_gym.config import HeadServer, NeMoGymSection, Timeouts
from recipe.nemo_gym.gym.errors import GymConfigError

TRAINING_MODEL_SERVER_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
AGENT_SERVER_TYPE = "responses_api_agents"
# Keys of NeMo Gym's global config that the spec's own fields own; `overrides` may not set them.
SPEC_OWNED_KEYS = frozenset(
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


def _default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


# The spec's fields that the config model also holds: spec field -> (model, the model's field).
_CONFIG_MODEL_FIELDS: dict[str, tuple[type[BaseModel], str]] = {
    "head_server_host": (HeadServer, "host"),
    "head_server_port": (HeadServer, "port"),
    "startup_timeout_s": (Timeouts, "startup_s"),
    "shutdown_grace_s": (Timeouts, "shutdown_grace_s"),
    "policy_health_timeout_s": (Timeouts, "policy_health_timeout_s"),
    "policy_health_failures": (Timeouts, "policy_health_failures"),
}


@dataclass(frozen=True)
class GymServersSpec:
    """Everything needed to start one NeMo Gym configuration.

    `config_paths` are the environments' configs; `model_server_config_path` (the training model server,
    `policy_model`, by default) is put first unless it is None. `overrides` is merged over the configs
    (nested dicts, NeMo Gym's own keys), e.g. `{"policy_model": {"responses_api_models": {"vllm_model":
    {"uses_reasoning_parser": False}}}}`. `environment` is the Python environment Gym runs from
    (`environment.locate_environment`: None means `$NEMO_GYM_ENV`, else `<repository>/.venv-gym`); Gym starts
    a Ray of its own, never the trainer's. `cache_dir` holds the venv links and uv's cache (default
    `$NEMO_GYM_VERL_CACHE`, else `~/.cache/verl-nemo-gym`). `log_dir` becomes NeMo Gym's `nemo_gym_log_dir`
    (one log file per server) and holds the launcher's own output (`gym_launcher.log`).
    While a batch waits, each policy server's `GET <root>/health` is probed with `policy_health_timeout_s`;
    `policy_health_failures` consecutive probes without any HTTP answer abort the batch (see `PolicyWatch`).
    """

    config_paths: tuple[str, ...]
    policy_base_urls: tuple[str, ...]
    policy_model_name: str
    policy_api_key: str = _default(NeMoGymSection, "policy_api_key")
    environment: Path | None = None
    head_server_host: str = _default(HeadServer, "host")
    head_server_port: int = _default(HeadServer, "port")
    model_server_config_path: str | None = TRAINING_MODEL_SERVER_CONFIG
    overrides: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None
    venv_dir: Path | None = None
    log_dir: Path | None = None
    startup_timeout_s: float = _default(Timeouts, "startup_s")
    shutdown_grace_s: float = _default(Timeouts, "shutdown_grace_s")
    policy_health_timeout_s: float = _default(Timeouts, "policy_health_timeout_s")
    policy_health_failures: int = _default(Timeouts, "policy_health_failures")

    def __post_init__(self) -> None:
        for name in ("config_paths", "policy_base_urls"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(str(v) for v in value))
        # The environments' configs, not the YAML's list: that one may hold only the model server's config.
        if not self.config_paths:
            raise GymConfigError("GymServersSpec.config_paths is empty: name at least one environment config")
        if not self.policy_base_urls:
            raise GymConfigError("GymServersSpec.policy_base_urls is empty: give the policy servers' base URLs")
        for url in self.policy_base_urls:
            if not url.startswith(("http://", "https://")):
                raise GymConfigError(f"GymServersSpec.policy_base_urls: {url!r} is not an http(s) URL")
        if not self.policy_model_name:
            raise GymConfigError("GymServersSpec.policy_model_name is empty")
        self._check_by_config_model()
        clashes = sorted(SPEC_OWNED_KEYS & set(self.overrides))
        if clashes:
            raise GymConfigError(f"GymServersSpec.overrides sets {clashes}, which the spec's own fields set")
        for name in ("environment", "cache_dir", "venv_dir", "log_dir"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))

    def _check_by_config_model(self) -> None:
        """Validate the fields the YAML also has with the config model's own rules, naming the spec's fields."""
        by_model: dict[type[BaseModel], dict[str, str]] = {}
        for name, (model, model_field) in _CONFIG_MODEL_FIELDS.items():
            by_model.setdefault(model, {})[model_field] = name
        problems = []
        for model, names in by_model.items():
            try:
                model.model_validate({model_field: getattr(self, name) for model_field, name in names.items()})
            except ValidationError as e:
                for err in e.errors(include_url=False):
                    name = names[str(err["loc"][0])]
                    problems.append(f"GymServersSpec.{name}: {err['msg']}, got {getattr(self, name)!r}")
        if problems:
            raise GymConfigError("; ".join(problems))

    @classmethod
    def from_config(
        cls,
        plugin_config: Any,
        policy_base_urls: Sequence[str],
        policy_model_name: str,
    ) -> GymServersSpec:
        """The spec for the plugin's validated YAML (`recipe.nemo_gym.config.NeMoGymConfig`).

        `nemo_gym.config_paths` are taken as the complete list (the training model server config included).
        With `nemo_gym.root` set, relative paths are made absolute under it; otherwise NeMo Gym's own
        resolution applies (current directory, then the installed package root). `uses_reasoning_parser` is
        applied to the `policy_model` server when it is NeMo Gym's `vllm_model`.
        """
        from omegaconf import OmegaConf

        section = plugin_config.nemo_gym
        paths = [str(p) for p in section.rooted_config_paths()]
        overrides: dict[str, Any] = {}
        if any("responses_api_models/vllm_model/" in p for p in paths):
            reasoning = {"uses_reasoning_parser": bool(section.uses_reasoning_parser)}
            overrides = {"policy_model": {"responses_api_models": {"vllm_model": reasoning}}}
        # NeMo Gym merges its configs with OmegaConf: the user's overrides merge the same way.
        merged = OmegaConf.merge(OmegaConf.create(overrides), OmegaConf.create(dict(section.config_overrides)))
        return cls(
            config_paths=tuple(paths),
            policy_base_urls=tuple(policy_base_urls),
            policy_model_name=policy_model_name,
            policy_api_key=section.policy_api_key,
            environment=section.environment,
            head_server_host=section.head_server.host,
            head_server_port=section.head_server.port,
            model_server_config_path=None,
            overrides=OmegaConf.to_container(merged, resolve=False),
            venv_dir=section.venv_dir,
            log_dir=section.log_dir,
            startup_timeout_s=plugin_config.timeouts.startup_s,
            shutdown_grace_s=plugin_config.timeouts.shutdown_grace_s,
            policy_health_timeout_s=plugin_config.timeouts.policy_health_timeout_s,
            policy_health_failures=plugin_config.timeouts.policy_health_failures,
        )

    @property
    def all_config_paths(self) -> tuple[str, ...]:
        head = (self.model_server_config_path,) if self.model_server_config_path else ()
        return head + tuple(p for p in self.config_paths if p != self.model_server_config_path)

    def resolved_cache_dir(self) -> Path:
        if self.cache_dir is not None:
            return self.cache_dir
        env = os.environ.get("NEMO_GYM_VERL_CACHE")
        return Path(env) if env else Path.home() / ".cache" / "verl-nemo-gym"


@dataclass(frozen=True)
class ServerInstance:
    """One server of a parsed NeMo Gym configuration: `name` is its top-level key (e.g. `policy_model`)."""

    name: str
    server_type: str
    implementation: str
    host: str | None
    port: int | None
    pid: int | None = None
    """The process Gym started it as (its wrapper shell), from the head server's `/server_instances`."""

    @property
    def server_dir(self) -> tuple[str, str]:
        """`(<type>, <implementation>)`: the folder NeMo Gym runs it from and keys its venv by."""
        return (self.server_type, self.implementation)

    @property
    def url(self) -> str | None:
        return f"http://{self.host}:{self.port}" if self.host and self.port else None


def build_global_config_dict(spec: GymServersSpec, venv_dir: Path, uv_cache_dir: Path) -> dict[str, Any]:
    """The keys the plugin sets in NeMo Gym's configuration, written to the config file Gym reads last.

    Gym merges its config files in order, so this one's keys win over the environments' configs (a key given on
    Gym's command line would win over it; the launcher passes only `config_paths` there). No
    `ray_head_node_address`: Gym starts a Ray of its own.
    """
    # Gym 0.7's launcher probes every model endpoint before it reports ready, and exits after this long without an
    # answer. The plugin finds verl's servers itself and health-checks them during batches (`health.PolicyWatch`);
    # a probe through the launcher's `requests` (which honours HTTP proxy variables) only adds a way to fail.
    config: dict[str, Any] = {"model_endpoint_readiness_timeout_seconds": 0}
    config.update(spec.overrides)
    config.update(
        {
            "policy_base_url": list(spec.policy_base_urls),
            "policy_api_key": spec.policy_api_key,
            "policy_model_name": spec.policy_model_name,
            "head_server": {"host": spec.head_server_host, "port": int(spec.head_server_port)},
            "skip_venv_if_present": True,
            "uv_venv_dir": str(venv_dir),
            "uv_cache_dir": str(uv_cache_dir),
        }
    )
    if spec.log_dir is not None:
        config["nemo_gym_log_dir"] = str(spec.log_dir)
    return config
