# SPDX-License-Identifier: Apache-2.0
"""What the plugin hands the NeMo Gym it starts, read from the validated environments file: no description of its own.

Contract (pure, but for `cache_root`, which reads the environment, and `merged_config`, which reads the config files):
- `gym_overrides(section, limits)` is the part of Gym's global config that comes from the environments file:
  `uses_reasoning_parser` applied to the `policy_model` server when it is NeMo Gym's `vllm_model`, the user's
  `nemo_gym.config_overrides` merged over it the way Gym merges its configs (OmegaConf), and the HTTP connection
  limits (`limits.ConnectionLimits`) under both. The config model refuses overrides of the keys
  `global_config` sets (`config.PLUGIN_SET_GYM_KEYS`).
- `merged_config(files, overrides)` is the config files Gym is started with and the overrides above, merged as Gym
  merges them. Over it, `replica_keys(replicas, merged, files)` declares the copies of `nemo_gym.replicas`
  (`replicas.py`; an agent it does not declare is a `GymConfigError` naming the key), and
  `judge_overrides(section, policy, merged, files)` gives the resources servers that name an LLM judge the plugin's
  (`nemo_gym.judge`, `judge.py`), or refuses a judge no config defines, naming the server.
- `global_config(section, policy, overrides, venv_dir, uv_cache_dir, log_dir)` is the file Gym reads last, so its
  keys win over the environments' configs: the overrides, then what only the plugin knows (verl's policy servers,
  the head server, the venv layout, the log folder).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recipe.nemo_gym.config import Judge, NeMoGymSection
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.over_http.limits import ConnectionLimits
from recipe.nemo_gym.gym.owned.judge import JudgeSettings, judge_keys, judge_references, undefined_judges
from recipe.nemo_gym.gym.replicas import replica_overrides
from recipe.nemo_gym.gym.types import PolicyServers

VLLM_MODEL_CONFIG_DIR = "responses_api_models/vllm_model/"


def cache_root() -> Path:
    """The plugin's cache folder (venv links, uv's cache): `$NEMO_GYM_VERL_CACHE`, else `~/.cache/verl-nemo-gym`."""
    env = os.environ.get("NEMO_GYM_VERL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "verl-nemo-gym"


def gym_overrides(section: NeMoGymSection, limits: ConnectionLimits | None = None) -> dict[str, Any]:
    """Gym's global-config keys that come from the environments file (see the module docstring)."""
    from omegaconf import OmegaConf

    overrides: dict[str, Any] = {}
    if any(VLLM_MODEL_CONFIG_DIR in p for p in section.config_paths):
        reasoning = {"uses_reasoning_parser": bool(section.uses_reasoning_parser)}
        overrides = {"policy_model": {"responses_api_models": {"vllm_model": reasoning}}}
    merged = OmegaConf.merge(OmegaConf.create(overrides), OmegaConf.create(dict(section.config_overrides)))
    from_yaml = OmegaConf.to_container(merged, resolve=False)
    return limits.merged_under(from_yaml) if limits is not None else from_yaml


def merged_config(files: Sequence[Path], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The config files Gym is started with and the overrides above, merged as Gym merges them (unresolved)."""
    import yaml
    from omegaconf import OmegaConf

    declared = [yaml.safe_load(path.read_text()) or {} for path in files]
    merged = OmegaConf.merge(*(OmegaConf.create(d) for d in declared), OmegaConf.create(dict(overrides)))
    return OmegaConf.to_container(merged, resolve=False)


def deep_merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`extra` merged over `base` as Gym merges configs (OmegaConf): mappings key by key, anything else replaced."""
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.create(dict(base)), OmegaConf.create(dict(extra)))
    return OmegaConf.to_container(merged, resolve=False)


def replica_keys(replicas: Mapping[str, int], merged: Mapping[str, Any], files: Sequence[Path]) -> dict[str, Any]:
    """Gym global-config keys declaring the agent copies of `replicas` in the `merged` config (see the module
    docstring); `files` are named in errors."""
    try:
        return replica_overrides(replicas, merged)
    except ValueError as e:
        raise GymConfigError(f"{e} (config files: {', '.join(map(str, files))})") from None


def judge_settings(judge: Judge, section: NeMoGymSection, policy: PolicyServers) -> JudgeSettings:
    """`nemo_gym.judge` resolved: `policy` is verl's own servers, under the policy's name, key and reasoning parser."""
    if judge.is_policy:
        urls, model = policy.base_urls, judge.model or policy.model_name
        api_key = judge.api_key if judge.api_key is not None else section.policy_api_key
        reasoning = section.uses_reasoning_parser
    else:
        urls, model, api_key, reasoning = tuple(judge.base_urls), judge.model or "", judge.api_key or "EMPTY", False
    if judge.uses_reasoning_parser is not None:
        reasoning = judge.uses_reasoning_parser
    return JudgeSettings(tuple(urls), model, api_key, reasoning, judge.extra_body, frozenset(judge.exclude_servers))


def judge_overrides(
    section: NeMoGymSection, policy: PolicyServers, merged: Mapping[str, Any], files: Sequence[Path]
) -> dict[str, Any]:
    """Gym global-config keys for the judge of `nemo_gym.judge`, over the `merged` config (`judge.py`). Refuses, naming
    each, a resources server whose judge no config defines and the plugin's judge does not replace."""
    references = judge_references(merged)
    judge = section.judge
    kept = [ref for ref in references if judge is None or ref.server in judge.exclude_servers]
    missing = undefined_judges(kept)
    if missing:
        listed = "; ".join(f"{ref.server!r} names judge_model_server {ref.judge!r}" for ref in missing)
        raise GymConfigError(
            f"NeMo Gym resources server(s) score with an LLM judge that no config defines: {listed} (config files: "
            f"{', '.join(map(str, files))}). Set nemo_gym.judge (`policy` for verl's own vLLM servers, or the "
            "judge's base_url and model), or define that model server in nemo_gym.config_paths"
        )
    if judge is None:
        return {}
    unknown = sorted(set(judge.exclude_servers) - {ref.server for ref in references})
    if unknown:
        raise GymConfigError(
            f"nemo_gym.judge.exclude_servers names {unknown}, which no resources server with a judge_model_server "
            f"is called (config files: {', '.join(map(str, files))})"
        )
    return judge_keys(judge_settings(judge, section, policy), references, merged)


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
