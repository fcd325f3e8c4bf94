# SPDX-License-Identifier: Apache-2.0
"""What an owned NeMo Gym is handed (`gym/owned/global_config.py`), with exact expectations: its global config from the
validated environments file, and what the file refuses because Gym could not be started with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from recipe.nemo_gym.config import NeMoGymSection, load_config
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.over_http.limits import ConnectionLimits
from recipe.nemo_gym.gym.owned.global_config import global_config, gym_overrides
from recipe.nemo_gym.gym.types import PolicyServers
from tests.support.gym_runtime import MATH_CONFIG as MATH


def test_global_config_exact(tmp_path: Path) -> None:
    section = NeMoGymSection(
        config_paths=[MATH], policy_api_key="k", head_server={"port": 12345}, log_dir=tmp_path / "logs"
    )
    policy = PolicyServers(("http://h1:8000/v1", "http://h2:8000/v1"), "/models/qwen")
    overrides = {"math_with_judge": {"resources_servers": {"math_with_judge": {"should_use_judge": False}}}}
    assert global_config(section, policy, overrides, Path("/v"), Path("/u"), tmp_path / "logs") == {
        "model_endpoint_readiness_timeout_seconds": 0,
        "math_with_judge": {"resources_servers": {"math_with_judge": {"should_use_judge": False}}},
        "policy_base_url": ["http://h1:8000/v1", "http://h2:8000/v1"],
        "policy_api_key": "k",
        "policy_model_name": "/models/qwen",
        "head_server": {"host": "127.0.0.1", "port": 12345},
        "skip_venv_if_present": True,
        "uv_venv_dir": "/v",
        "uv_cache_dir": "/u",
        "nemo_gym_log_dir": str(tmp_path / "logs"),
    }


def test_the_plugin_yaml_is_what_gym_is_started_with(tmp_path: Path) -> None:
    """Every key of `nemo_gym` that reaches Gym, read from the validated YAML itself (no second description)."""
    path = tmp_path / "plugin.yaml"
    path.write_text(
        f"""
nemo_gym:
  environment: {tmp_path}/gym-env
  root: {tmp_path}
  config_paths:
    - responses_api_models/vllm_model/configs/vllm_model_for_training.yaml
    - /abs/env.yaml
  config_overrides:
    policy_model: {{responses_api_models: {{vllm_model: {{extra_body: {{x: 1}}}}}}}}
    global_aiohttp_connector_limit: 7
  head_server: {{host: 0.0.0.0, port: 12001}}
  policy_api_key: secret
  uses_reasoning_parser: true
  venv_dir: {tmp_path}/venvs
  log_dir: {tmp_path}/logs
timeouts: {{startup_s: 42, shutdown_grace_s: 3}}
"""
    )
    section = load_config(path).nemo_gym
    assert section.rooted_config_paths() == [
        str(tmp_path / "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"),
        "/abs/env.yaml",
    ]
    limits = ConnectionLimits(total=50, per_host=5, soft=1024, hard=1024, server_soft=1024)
    overrides = gym_overrides(section, limits)
    # The limits go under the user's overrides: the user's total wins, the per-host limit is the derived one.
    assert overrides == {
        "global_aiohttp_connector_limit": 7,
        "global_aiohttp_connector_limit_per_host": 5,
        "policy_model": {
            "responses_api_models": {"vllm_model": {"uses_reasoning_parser": True, "extra_body": {"x": 1}}}
        },
    }
    job = global_config(section, PolicyServers(("http://h:1/v1",), "served-name"), overrides, Path("/v"), Path("/u"),
                        section.log_dir)  # fmt: skip
    assert (job["head_server"], job["policy_api_key"], job["policy_model_name"]) == (
        {"host": "0.0.0.0", "port": 12001},
        "secret",
        "served-name",
    )
    assert (section.environment, section.venv_dir, job["nemo_gym_log_dir"]) == (
        tmp_path / "gym-env",
        tmp_path / "venvs",
        str(tmp_path / "logs"),
    )


@pytest.mark.parametrize(
    ("nemo_gym", "needle"),
    [
        (
            {"config_overrides": {"head_server": {"port": 1}}},
            "nemo_gym.config_overrides: Value error, sets ['head_server']",
        ),
        ({"config_overrides": {"ray_head_node_address": "x:6379"}}, "sets ['ray_head_node_address'], which the plugin"),
        ({"head_server": {"port": 70000}}, "nemo_gym.head_server.port: Input should be less than or equal to 65535"),
    ],
)
def test_the_yaml_refuses_what_gym_could_not_be_started_with_naming_the_key(tmp_path, nemo_gym, needle) -> None:
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump({"nemo_gym": {"config_paths": [MATH], **nemo_gym}}))
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(path)


@pytest.mark.parametrize(
    ("base_urls", "model", "needle"),
    [
        ((), "m", "no policy server"),
        (("localhost:8000",), "m", "['localhost:8000'] are not http(s) URLs"),
        (("http://h:1/v1",), "", "model name is empty"),
    ],
)
def test_policy_servers_refuse_what_gym_could_not_call(base_urls, model, needle) -> None:
    with pytest.raises(GymConfigError, match=re.escape(needle)):
        PolicyServers(base_urls, model)
