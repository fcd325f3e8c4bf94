"""The plugin YAML: shipped configs load, bad keys and unset variables are named."""

from pathlib import Path

import pytest

from recipe.nemo_gym.config import ConfigError, load_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "nemo_gym" / "configs"


@pytest.mark.parametrize("name", ["math", "workplace", "multienv"])
def test_shipped_configs_validate_and_resolve_inside_installed_nemo_gym(name):
    config = load_config(CONFIG_DIR / f"{name}.yaml")
    paths = config.nemo_gym.resolved_config_paths()
    assert paths[0].name == "vllm_model_for_training.yaml"
    assert all(p.is_file() for p in paths)
    assert config.failures.max_fraction == 0.05


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
        load_config(path).nemo_gym.resolved_config_paths()


def test_missing_file_and_out_of_range_values_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")
    path = tmp_path / "c.yaml"
    path.write_text("nemo_gym:\n  config_paths: [a.yaml]\nfailures:\n  max_fraction: 2\n")
    with pytest.raises(ConfigError, match=r"failures\.max_fraction"):
        load_config(path)
