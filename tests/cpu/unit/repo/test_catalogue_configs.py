# SPDX-License-Identifier: Apache-2.0
"""The shipped environments files of NeMo Gym's catalogue (`recipe/nemo_gym/configs/<kind>.yaml`) are what the catalogue
test starts (`tests/cpu/integration/test_catalogue.py`): for every answer module of
`tests/support/cpu_policy/catalogue/`, the config of the same name lists the training model server, then exactly the
module's Gym configs, holds exactly its overrides, and names a judge exactly when one of its answers is judged. Every
config validates as an environments file."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from recipe.nemo_gym.config import load_config
from recipe.nemo_gym.gym.owned.gym_layout import nemo_gym_install_root
from tests.support.cpu_policy import catalogue
from tests.support.helpers import REPO_ROOT

CONFIGS = REPO_ROOT / "recipe" / "nemo_gym" / "configs"
TRAINING_MODEL_SERVER = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
KINDS = sorted(module.name for module in pkgutil.iter_modules(catalogue.__path__))


def test_every_answer_module_has_its_shipped_config():
    assert len(KINDS) >= 10, KINDS
    missing = [kind for kind in KINDS if not (CONFIGS / f"{kind}.yaml").is_file()]
    assert not missing, f"answer modules without a shipped config in {CONFIGS}: {missing}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_shipped_config_starts_exactly_the_servers_its_answers_are_checked_on(kind, monkeypatch):
    # judged_safety.yaml names the user's own classifier deployment.
    monkeypatch.setenv("SAFETY_JUDGE_URL", "http://classifier:8000/v1")
    monkeypatch.setenv("SAFETY_JUDGE_MODEL", "classifier")
    module = importlib.import_module(f"tests.support.cpu_policy.catalogue.{kind}")
    path = CONFIGS / f"{kind}.yaml"
    section = load_config(path).nemo_gym
    assert section.config_paths == [TRAINING_MODEL_SERVER, *module.CONFIGS]
    assert section.config_overrides == getattr(module, "OVERRIDES", {})
    judged = any(answer.judge for answer in module.answers(nemo_gym_install_root()))
    assert (section.judge is not None) == judged, "the judged kinds, and only they, name the plugin's judge"
    assert {a.agent for a in module.answers(nemo_gym_install_root())} == set(module.EXAMPLES)
