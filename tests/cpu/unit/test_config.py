# SPDX-License-Identifier: Apache-2.0
"""The environments file: shipped configs load, bad keys and unset variables are named."""

import pytest

from recipe.nemo_gym.config import ConfigError, load_config
from recipe.nemo_gym.gym.owned.gym_layout import section_config_paths
from tests.support.helpers import REPO_ROOT

CONFIG_DIR = REPO_ROOT / "recipe" / "nemo_gym" / "configs"


@pytest.mark.parametrize("name", ["math", "workplace", "multienv"])
def test_shipped_configs_validate_and_resolve_inside_installed_nemo_gym(name):
    config = load_config(CONFIG_DIR / f"{name}.yaml")
    paths = section_config_paths(config.nemo_gym)
    assert paths[0].name == "vllm_model_for_training.yaml"
    assert all(p.is_file() for p in paths)
    assert config.failures.max_fraction == 0.05


def test_shipped_attach_config_takes_the_head_server_from_the_environment(monkeypatch):
    monkeypatch.setenv("NEMO_GYM_HEAD_SERVER_URL", "http://cpu-node-3:11000")
    config = load_config(CONFIG_DIR / "attach.yaml")
    assert config.nemo_gym.attach.head_server_url == "http://cpu-node-3:11000"
    assert config.nemo_gym.config_paths == []
    monkeypatch.delenv("NEMO_GYM_HEAD_SERVER_URL")
    with pytest.raises(ConfigError, match=r"nemo_gym\.attach\.head_server_url: environment variable"):
        load_config(CONFIG_DIR / "attach.yaml")


def test_unknown_key_is_rejected_by_its_dotted_name(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nemo_gym:\n  config_paths: [a.yaml]\n  head_sever: {port: 1}\n")
    with pytest.raises(ConfigError, match=r"nemo_gym\.head_sever: Extra inputs are not permitted"):
        load_config(path)


def test_environment_variables_expand_and_unset_ones_name_the_key(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("nemo_gym:\n  config_paths: ['${GYM_CFG}/x.yaml']\n")
    monkeypatch.setenv("GYM_CFG", "/data/gym")
    assert load_config(path).nemo_gym.config_paths == ["/data/gym/x.yaml"]
    monkeypatch.delenv("GYM_CFG")
    with pytest.raises(ConfigError, match=r"nemo_gym\.config_paths\[0\]: environment variable 'GYM_CFG' is not set"):
        load_config(path)


def test_missing_nemo_gym_config_file_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nemo_gym:\n  config_paths: [resources_servers/nope/configs/nope.yaml]\n")
    with pytest.raises(ConfigError, match=r"not found: .*resources_servers/nope/configs/nope\.yaml"):
        section_config_paths(load_config(path).nemo_gym)


def test_missing_file_and_out_of_range_values_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")
    path = tmp_path / "c.yaml"
    path.write_text("nemo_gym:\n  config_paths: [a.yaml]\nfailures:\n  max_fraction: 2\n")
    with pytest.raises(ConfigError, match=r"failures\.max_fraction"):
        load_config(path)


def test_config_paths_resolve_by_the_rule_the_runtime_checks(tmp_path, monkeypatch):
    """One rule (`gym.owned.gym_layout.check_config_paths`): the current directory first, then NeMo Gym's root; with
    `nemo_gym.root` set, relative paths are taken under it, as `OwnedGym.start` hands them to Gym."""
    from recipe.nemo_gym.gym.owned.gym_layout import nemo_gym_install_root

    model = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
    local = tmp_path / "resources_servers/mine/configs/mine.yaml"
    local.parent.mkdir(parents=True)
    local.write_text("x: 1\n")
    path = tmp_path / "c.yaml"
    path.write_text(f"nemo_gym:\n  config_paths: [{model}, resources_servers/mine/configs/mine.yaml]\n")
    monkeypatch.chdir(tmp_path)
    section = load_config(path).nemo_gym
    assert section.rooted_config_paths() == section.config_paths
    assert section_config_paths(section) == [nemo_gym_install_root() / model, local]
    path.write_text(f"nemo_gym:\n  root: {tmp_path / 'elsewhere'}\n  config_paths: [{model}]\n")
    section = load_config(path).nemo_gym
    assert section.rooted_config_paths() == [str(tmp_path / "elsewhere" / model)]
    with pytest.raises(ConfigError, match=r"not found: .*elsewhere/responses_api_models"):
        section_config_paths(section)
