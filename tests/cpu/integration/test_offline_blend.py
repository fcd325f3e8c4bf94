# SPDX-License-Identifier: Apache-2.0
"""Seven more of NeMo Gym 0.7's environments, from the shipped `recipe/nemo_gym/configs/offline_blend.yaml`: each
scores a right and a wrong answer itself, and every episode packs with only the policy's tokens trained.

Path under test (nothing replaced; vLLM is its CPU build): one example row per environment from Gym's environment
(`.venv-gym`: Gym 0.7) -> the plugin's dataset -> the real manager over verl's vLLM rollout (the suite's shared
engine, splice patch armed; each row names its own script, `tests/support/cpu_policy/offline_blend.py`, which says
what each answer is and why the environment scores it so) -> Gym's calendar, example_tool_call_multireward,
freeform_formatting, xlam_fc, math_with_code (a stateful Python tool), structeval_nonrenderable and wordle (Gym's
gymnasium_agent) -> the packed DataProto and the step's metrics.
"""

from __future__ import annotations

import json

import pytest

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym.token_fields import TOKEN_FIELDS
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness, offline_blend

pytestmark = pytest.mark.integration

CONFIG = harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "offline_blend.yaml"


def gym_root():
    from recipe.nemo_gym.config import NeMoGymSection
    from recipe.nemo_gym.gym.owned.seams import section_root

    return section_root(NeMoGymSection(config_paths=["-"]))  # Gym's own files, in its environment


@pytest.fixture(scope="module")
def episodes(tmp_path_factory, shared_engine):
    plays = offline_blend.answers(gym_root())
    data = write_jsonl([play.row for play in plays], tmp_path_factory.mktemp("offline_blend") / "rows.jsonl")
    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), CONFIG, prompt_length=4096, response_length=1024, n=1, batch_size=len(plays)
    )
    policies = [play.policy for play in plays]
    with harness.manager_stack(tiny_qwen3_dir(), overrides, data, policies, engine=shared_engine) as stack:
        _, batch = harness.trainer_batches(stack["dataset"], range(len(plays)), stack["config"])
        output = stack["manager"].generate_sequences(batch)
        yield plays, output, list(stack["manager"].last_results), stack["manager"].tokenizer


def _calls(result):
    return [
        tuple(item[f] for f in TOKEN_FIELDS)
        for item in result["response"]["output"]
        if all(item.get(f) is not None for f in TOKEN_FIELDS)
    ]


def test_each_environment_scores_the_right_answer_and_the_wrong_one_itself(episodes):
    plays, output, results, _ = episodes
    assert len(results) == len(plays) == 14
    assert not [r for r in results if isinstance(r, EpisodeFailure)], [
        r for r in results if isinstance(r, EpisodeFailure)
    ]
    verdicts = [(p.agent, p.verdict, r["reward"], len(_calls(r))) for p, r in zip(plays, results, strict=True)]
    print(
        "\n"
        + "\n".join(
            f"{agent} {verdict}: reward {reward}, model calls {calls}" for agent, verdict, reward, calls in verdicts
        )
    )
    assert [(a, v, pytest.approx(r), c) for a, v, r, c in verdicts] == [
        (p.agent, p.verdict, p.reward, p.model_calls) for p in plays
    ]
    timing = output.meta_info["timing"]
    for agent in offline_blend.EXAMPLES:
        assert timing[f"nemo_gym/{agent}/episodes"] == 2 and timing[f"nemo_gym/{agent}/failed"] == 0


def test_every_episode_trains_on_exactly_the_policys_tokens_with_its_reward(episodes):
    _, output, results, _ = episodes
    responses, mask = output.batch["responses"], output.batch["response_mask"]
    for row, result in enumerate(results):
        calls = _calls(result)
        for (prev_prompt, prev_gen, _), (prompt, _, _) in zip(calls, calls[1:], strict=False):
            assert prompt[: len(prev_prompt) + len(prev_gen)] == prev_prompt + prev_gen  # contiguous turns
        trained = responses[row][mask[row].bool()].tolist()
        assert trained == [token for _, generation, _ in calls for token in generation], f"row {row}"
        log_probs = output.batch["rollout_log_probs"][row][mask[row].bool()].tolist()
        assert log_probs == pytest.approx([lp for _, _, lps in calls for lp in lps], abs=1e-6)
    assert output.batch["rm_scores"].sum(-1).tolist() == pytest.approx([float(r["reward"]) for r in results])


def test_calendars_pre_written_assistant_turns_are_prompt_and_never_trained(episodes):
    plays, output, results, tokenizer = episodes
    rows = [row for row, play in enumerate(plays) if play.agent == offline_blend.CALENDAR]
    history = [m["content"] for m in plays[rows[0]].row["responses_create_params"]["input"] if m["role"] == "assistant"]
    assert len(history) == 4  # turns the policy never generated: they carry no token IDs
    for row in rows:
        ((prompt_ids, generation_ids, _),) = _calls(results[row])
        prompt = tokenizer.decode(prompt_ids)
        assert all(turn in prompt for turn in history)  # rendered into the one model call's prompt...
        response = tokenizer.decode(output.batch["responses"][row][output.batch["response_mask"][row].bool()])
        assert not any(turn in response for turn in history[:-1])  # ...and not in what is trained
        assert output.batch["response_mask"][row].sum().item() == len(generation_ids)
        assert output.batch["prompts"][row][-len(prompt_ids) :].tolist() == prompt_ids


def test_each_reward_component_reaches_the_metrics_of_its_environment(episodes):
    plays, output, results, _ = episodes
    for play, result in zip(plays, results, strict=True):
        if play.components:
            assert result["reward_components"] == play.components
    timing = output.meta_info["timing"]
    prefix = f"nemo_gym/{offline_blend.MULTIREWARD}/reward_component"
    assert {key: timing[key] for key in timing if key.startswith(prefix)} == {
        f"{prefix}/correctness/mean": 0.5,
        f"{prefix}/correctness/max": 1.0,
        f"{prefix}/format/mean": 0.0,
        f"{prefix}/format/max": 0.0,
        f"{prefix}/schema_valid/mean": 0.5,
        f"{prefix}/schema_valid/max": 1.0,
    }
    others = [key for key in timing if "/reward_component/" in key and offline_blend.MULTIREWARD not in key]
    assert sorted(others) == sorted(
        key.replace(offline_blend.MULTIREWARD, "all") for key in timing if key.startswith(prefix)
    )
    print(json.dumps({key: timing[key] for key in sorted(timing) if "/reward/mean" in key}, indent=1))
