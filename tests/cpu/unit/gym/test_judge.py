# SPDX-License-Identifier: Apache-2.0
"""The plugin's LLM judge (`nemo_gym.judge`): which resources servers name one, the Gym keys that make it theirs
(`gym/owned/judge.py`), its three forms resolved (`global_config.judge_settings`), and the start-up refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.nemo_gym.config import NeMoGymConfig, NeMoGymSection
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.owned.global_config import judge_overrides, judge_settings
from recipe.nemo_gym.gym.owned.judge import (
    JUDGE_SERVER,
    JudgeReference,
    JudgeSettings,
    judge_keys,
    judge_references,
    undefined_judges,
)
from recipe.nemo_gym.gym.types import PolicyServers

POLICY = PolicyServers(("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"), "/models/qwen3")
FILES = [Path("simpleqa.yaml")]


def _resources(name: str, judge: str | None = None, **settings) -> dict:
    if judge is not None:
        settings["judge_model_server"] = {"type": "responses_api_models", "name": judge}
    return {name: {"resources_servers": {name: {"entrypoint": "app.py", **settings}}}}


def _model(name: str, implementation: str = "openai_model") -> dict:
    return {name: {"responses_api_models": {implementation: {"entrypoint": "app.py"}}}}


def _agent(name: str, resources: str, model: str = "policy_model") -> dict:
    refs = {"resources_server": {"type": "resources_servers", "name": resources}}
    refs["model_server"] = {"type": "responses_api_models", "name": model}
    return {name: {"responses_api_agents": {"simple_agent": refs}}}


# Gym's configs as they come: a judge no config defines (simpleqa's genrm_model), one defined beside its server on a
# hosted API (frontierscience's judge_model), the policy itself (equivalence_llm_judge), and a server with none.
MERGED = {
    **_model("policy_model", "vllm_model"),
    **_resources("simpleqa", "genrm_model"),
    **_agent("simpleqa_simple_agent", "simpleqa"),
    **_resources("frontierscience_judge", "judge_model", judge_mode="olympiad"),
    **_model("judge_model"),
    **_agent("frontierscience_judge_simple_agent", "frontierscience_judge"),
    **_resources("equivalence_llm_judge", "policy_model"),
    **_agent("equivalence_llm_judge_simple_agent", "equivalence_llm_judge"),
    **_resources("gpqa_diamond"),
    "judge_base_url": "https://integrate.api.nvidia.com/v1",
}
SETTINGS = JudgeSettings(("http://judge:8000/v1",), "judge-72b", "sk-test", False, {})


def test_judge_references_list_each_resources_server_that_names_a_judge_and_whether_it_is_defined():
    references = judge_references(MERGED)
    assert references == [
        JudgeReference("simpleqa", "genrm_model", defined=False),
        JudgeReference("frontierscience_judge", "judge_model", defined=True),
        JudgeReference("equivalence_llm_judge", "policy_model", defined=True),
    ]
    assert undefined_judges(references) == [references[0]]


def test_judge_keys_point_every_judge_at_one_vllm_model_server_and_remove_the_judges_nothing_else_calls():
    keys = judge_keys(SETTINGS, judge_references(MERGED), MERGED)
    redirect = {"type": "responses_api_models", "name": JUDGE_SERVER}
    assert keys == {
        JUDGE_SERVER: {
            "responses_api_models": {
                "vllm_model": {
                    "entrypoint": "app.py",
                    "base_url": ["http://judge:8000/v1"],
                    "api_key": "sk-test",
                    "model": "judge-72b",
                    "return_token_id_information": False,
                    "propagate_context_overflow_errors": True,
                    "uses_reasoning_parser": False,
                }
            }
        },
        "simpleqa": {"resources_servers": {"simpleqa": {"judge_model_server": redirect}}},
        "frontierscience_judge": {"resources_servers": {"frontierscience_judge": {"judge_model_server": redirect}}},
        "equivalence_llm_judge": {"resources_servers": {"equivalence_llm_judge": {"judge_model_server": redirect}}},
        # frontierscience's hosted judge is called by no one now; the policy's model server still serves the agents.
        "judge_model": None,
    }


def test_an_excluded_server_keeps_its_own_judge_and_the_extra_body_reaches_the_judge_server():
    settings = JudgeSettings(
        ("http://j/v1",), "m", "EMPTY", True, {"vllm_xargs": {"k": "v"}}, frozenset({"frontierscience_judge"})
    )
    keys = judge_keys(settings, judge_references(MERGED), MERGED)
    assert "frontierscience_judge" not in keys and "judge_model" not in keys
    judge = keys[JUDGE_SERVER]["responses_api_models"]["vllm_model"]
    assert judge["extra_body"] == {"vllm_xargs": {"k": "v"}} and judge["uses_reasoning_parser"] is True


def _section(**judge) -> NeMoGymSection:
    return NeMoGymConfig.model_validate(
        {"nemo_gym": {"config_paths": ["x.yaml"], "policy_api_key": "verl-key", "uses_reasoning_parser": True, **judge}}
    ).nemo_gym


def test_the_policy_judge_is_verls_own_servers_under_the_policys_name_key_and_reasoning_parser():
    section = _section(judge="policy")
    assert judge_settings(section.judge, section, POLICY) == JudgeSettings(
        POLICY.base_urls, "/models/qwen3", "verl-key", True, {}
    )
    url = _section(judge={"base_url": ["http://a/v1", "http://b/v1"], "model": "judge", "uses_reasoning_parser": True})
    assert judge_settings(url.judge, url, POLICY) == JudgeSettings(
        ("http://a/v1", "http://b/v1"), "judge", "EMPTY", True, {}
    )


def test_without_a_judge_a_server_whose_judge_no_config_defines_is_refused_naming_both():
    with pytest.raises(GymConfigError) as raised:
        judge_overrides(_section(), POLICY, MERGED, FILES)
    message = str(raised.value)
    assert "'simpleqa' names judge_model_server 'genrm_model'" in message and "frontierscience" not in message
    assert "Set nemo_gym.judge" in message and "simpleqa.yaml" in message
    defined_only = {k: v for k, v in MERGED.items() if not k.startswith("simpleqa")}
    assert judge_overrides(_section(), POLICY, defined_only, FILES) == {}  # each keeps its own judge


def test_a_judge_excluding_a_server_still_refuses_its_undefined_judge_and_unknown_names():
    with pytest.raises(GymConfigError, match="'simpleqa' names judge_model_server 'genrm_model'"):
        judge_overrides(_section(judge={"base_url": "policy", "exclude_servers": ["simpleqa"]}), POLICY, MERGED, FILES)
    with pytest.raises(GymConfigError, match=r"exclude_servers names \['typo'\]"):
        judge_overrides(_section(judge={"base_url": "policy", "exclude_servers": ["typo"]}), POLICY, MERGED, FILES)
    keys = judge_overrides(_section(judge="policy"), POLICY, MERGED, FILES)
    assert keys[JUDGE_SERVER]["responses_api_models"]["vllm_model"]["base_url"] == list(POLICY.base_urls)


@pytest.mark.parametrize(
    ("judge", "error"),
    [
        ({"base_url": "http://judge:8000/v1"}, "judge.model is required with a judge URL"),
        ({"base_url": "judge:8000", "model": "m"}, r"expected 'policy' or http\(s\) base URLs"),
        ({"base_url": "policy", "temperature": 0}, "nemo_gym.judge.temperature: Extra inputs are not permitted"),
    ],
)
def test_a_bad_judge_block_is_refused_naming_the_key(tmp_path, judge, error):
    import yaml

    from recipe.nemo_gym.config import load_config

    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump({"nemo_gym": {"config_paths": ["x.yaml"], "judge": judge}}))
    with pytest.raises(ConfigError, match=error):
        load_config(path)


def test_an_attached_gym_runs_its_own_judge():
    with pytest.raises(ValueError, match="judge configure the NeMo Gym the plugin starts"):
        NeMoGymConfig.model_validate(
            {"nemo_gym": {"attach": {"head_server_url": "http://gym:11000"}, "judge": "policy"}}
        )
