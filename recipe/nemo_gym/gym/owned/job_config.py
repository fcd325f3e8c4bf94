# SPDX-License-Identifier: Apache-2.0
"""What the plugin hands the NeMo Gym it starts, read from the validated plugin YAML: no description of its own.

Contract (pure, but for `cache_root`, which reads the environment, and `replica_keys`, which reads the config files):
- `gym_overrides(section, limits)` is the part of Gym's global config that comes from the plugin YAML:
  `uses_reasoning_parser` applied to the `policy_model` server when it is NeMo Gym's `vllm_model`, the user's
  `nemo_gym.config_overrides` merged over it the way Gym merges its configs (OmegaConf), and the HTTP connection
  limits (`limits.ConnectionLimits`) under both. The config model refuses overrides of the keys
  `global_config` sets (`config.PLUGIN_SET_GYM_KEYS`).
- `replica_keys(replicas, files, overrides)` declares the copies of `nemo_gym.replicas` (`replicas.py`), from the
  config files Gym is started with and the overrides above, merged as Gym merges them; an agent they do not declare
  is a `GymConfigError` naming the key.
- `global_config(section, policy, overrides, venv_dir, uv_cache_dir, log_dir)` is the file Gym reads last, so its
  keys win over the environments' configs: the overrides, then what only the plugin knows (verl's policy servers,
  the head server, the venv layout, the log folder).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recipe.nemo_gym.config import NeMoGymSection
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.over_http.connection import PolicyServers
from recipe.nemo_gym.gym.replicas import replica_overrides
from recipe.nemo_gym.limits import ConnectionLimits

VLLM_MODEL_CONFIG_DIR = "responses_api_models/vllm_model/"


def cache_root() -> Path:
    """The plugin's cache folder (venv links, uv's cache): `$NEMO_GYM_VERL_CACHE`, else `~/.cache/verl-nemo-gym`."""
    env = os.environ.get("NEMO_GYM_VERL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "verl-nemo-gym"


def gym_overrides(section: NeMoGymSection, limits: ConnectionLimits | None = None) -> dict[str, Any]:
    """Gym's global-config keys that come from the plugin YAML (see the module docstring)."""
    from omegaconf import OmegaConf

    overrides: dict[str, Any] = {}
    if any(VLLM_MODEL_CONFIG_DIR in p for p in section.config_paths):
        reasoning = {"uses_reasoning_parser": bool(section.uses_reasoning_parser)}
        overrides = {"policy_model": {"responses_api_models": {"vllm_model": reasoning}}}
    merged = OmegaConf.merge(OmegaConf.create(overrides), OmegaConf.create(dict(section.config_overrides)))
    from_yaml = OmegaConf.to_container(merged, resolve=False)
    return limits.merged_under(from_yaml) if limits is not None else from_yaml


def replica_keys(replicas: Mapping[str, int], files: Sequence[Path], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Gym global-config keys declaring the agent copies of `replicas` (see the module docstring)."""
    import yaml
    from omegaconf import OmegaConf

    declared = [yaml.safe_load(path.read_text()) or {} for path in files]
    merged = OmegaConf.merge(*(OmegaConf.create(d) for d in declared), OmegaConf.create(dict(overrides)))
    try:
        return replica_overrides(replicas, OmegaConf.to_container(merged, resolve=False))
    except ValueError as e:
        raise GymConfigError(f"{e} (config files: {', '.join(map(str, files))})") from None


def global_config(
    section: NeMoGymSection,
    policy: PolicyServers,
    overrides: Mapping[str, Any],
    venv_dir: Path,
    uv_cache_dir: Path,
    log_dir: Path,
) -> dict[str, Any]:
    """The keys the plugin sets in NeMo Gym's configuration, written to the config file Gym reads last.

    Gym merges its config files in order, so this one's keys win over the environments' configs (a key given on
    Gym's command line would win over it; the plugin passes only `config_paths` there, and `lean_ray.py` the
    `ray_head_node_address` of the private Ray it starts for Gym).
    """
    # Gym 0.7's launcher probes every model endpoint before it reports ready, and exits after this long without an
    # answer. The plugin finds verl's servers itself and health-checks them during batches (`health.PolicyWatch`);
    # a probe through the launcher's `requests` (which honours HTTP proxy variables) only adds a way to fail.
    config: dict[str, Any] = {"model_endpoint_readiness_timeout_seconds": 0}
    config.update(overrides)
    config.update(
        {
            "policy_base_url": list(policy.base_urls),
            "policy_api_key": section.policy_api_key,
            "policy_model_name": policy.model_name,
            "head_server": {"host": section.head_server.host, "port": section.head_server.port},
            "skip_venv_if_present": True,
            "uv_venv_dir": str(venv_dir),
            "uv_cache_dir": str(uv_cache_dir),
            "nemo_gym_log_dir": str(log_dir),
        }
    )
    return config
