# SPDX-License-Identifier: Apache-2.0
"""The plugin's judge as a URL of its own (`nemo_gym.judge: {base_url, model, api_key}`), and judge calls that fail.

The stack: `configs/judged_qa.yaml`'s eight judge-scored servers (`tests/support/catalogue_stack.py`), judged through a
judge deployment of their own: `tests/support/judge_proxy.py`, an OpenAI-compatible HTTP hop with its own model name
and key in front of the suite's shared engine (which plays the judge's scripted verdicts), refusing some requests on
purpose, as the real engine cannot be made to. Three batches through the real manager:

1. the answers: each server scores its right and its wrong answer through that judge (right above wrong), every
   judge call went there, and every episode trains on exactly the policy's tokens;
2. two rows of `simpleqa`, three samples each: the first sample of one has its judge call refused once (Gym's
   `judge_failed` row; the plugin retries it, and it trains), one sample of the other on every try (masked as
   `judge_failed`, counted by cause, left out of the reward and of its siblings' GRPO baseline);
3. a `multichallenge` row whose judge calls the judge refuses as longer than its context: a failed judge call
   (`judge_failed`), not the empty verdict Gym's model server would make of it, which that server scores 0 (a NO on
   every rubric item).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause
from recipe.nemo_gym.gym.owned.gym_layout import nemo_gym_install_root
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.catalogue_stack import Played, check_scores, check_tokens, kind_answers, play
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.answers import ANY, Answer, example_row, policy, verdict
from tests.support.judge_proxy import CONTEXT, ONCE, FlakyJudgeProxy

pytestmark = pytest.mark.integration

KINDS = ("judged_qa",)
SIMPLEQA = "simpleqa_simple_agent"
MULTICHALLENGE = "multichallenge_simple_agent"
FIRST_OF_3 = "FAIL_JUDGE_FIRST_OF_3"


def flaky_answers() -> list[Answer]:
    """Two rows of simpleqa's example row 1 (the capital of France) answered right, whose judge requests carry a
    marker the judge's server acts on (`judge_proxy.py`), and multichallenge's right answer marked to be refused as
    longer than the judge's context."""
    row = example_row(nemo_gym_install_root(), "resources_servers/simpleqa/data/example.jsonl", 1, SIMPLEQA)
    flaky = [
        Answer(SIMPLEQA, "right", row, policy((ANY, f"Paris. {marker}")), 1.0, 1, judge=(verdict(marker, marker, "A"),))
        for marker in (ONCE, FIRST_OF_3)
    ]
    right = next(a for a in kind_answers(KINDS) if a.agent == MULTICHALLENGE and a.verdict == "right")
    text = right.policy.rules[0].completion.text
    overlong = Answer(MULTICHALLENGE, "right", right.row, policy((ANY, f"{text} {CONTEXT}")), 1.0, 1)
    return [*flaky, overlong]


@dataclass
class UrlJudged:
    played: Played
    flaky: Any  # batch 2: the flaky simpleqa rows, three samples each
    flaky_uids: np.ndarray  # the trainer's uid of each of its rows (one per prompt)
    flaky_results: list[Any]
    overlong: Any  # batch 3: the row whose judge request is over the judge's context
    overlong_results: list[Any]
    proxy: FlakyJudgeProxy


@pytest.fixture(scope="module")
def url_judged(tmp_path_factory, shared_engine):
    tmp = tmp_path_factory.mktemp("url_judged")
    engine_model = str(tiny_qwen3_dir())  # verl's vLLM serves the model under its local path
    with FlakyJudgeProxy(shared_engine.base_url, engine_model) as proxy:
        judge = {"base_url": proxy.url, "model": proxy.model, "api_key": proxy.api_key}
        extra = flaky_answers()
        with play(tmp, shared_engine, KINDS, judge=judge, extra=extra) as result:
            first, dataset, config = len(result.answers), result.stack["dataset"], result.stack["config"]
            config.actor_rollout_ref.rollout.n = 3
            kept, batch = harness.trainer_batches(dataset, range(first, first + 2), config)
            flaky = result.manager.generate_sequences(batch)
            flaky_results = list(result.manager.last_results)
            uids = np.array([str(uid) for uid in kept.non_tensor_batch["uid"]], dtype=object)
            config.actor_rollout_ref.rollout.n = 1
            _, batch = harness.trainer_batches(dataset, [first + 2], config)
            overlong = result.manager.generate_sequences(batch)
            yield UrlJudged(result, flaky, uids, flaky_results, overlong, list(result.manager.last_results), proxy)


def test_servers_judged_through_a_judge_url_score_the_right_answer_above_the_wrong_one(url_judged):
    check_scores(url_judged.played)
    check_tokens(url_judged.played)
    # Every judge call went to the judge's URL, under its model name and key (anything else is refused there).
    judged = sum(1 for a in url_judged.played.answers if a.judge)
    assert url_judged.proxy.requests[None] >= judged > 0


def test_a_judge_that_fails_once_is_retried_and_one_that_keeps_failing_masks_its_sample(url_judged):
    flaky, results, proxy = url_judged.flaky, url_judged.flaky_results, url_judged.proxy
    assert len(results) == 6  # two rows, three samples each
    once, persistent = results[:3], results[3:]
    assert [r["reward"] for r in once] == [1.0, 1.0, 1.0]  # one of them after its retry
    failed = [r for r in persistent if isinstance(r, EpisodeFailure)]
    assert len(failed) == 1 and failed[0].cause is FailureCause.JUDGE_FAILED, persistent
    assert "judge_failed" in failed[0].detail
    assert [r["reward"] for r in persistent if not isinstance(r, EpisodeFailure)] == [1.0, 1.0]
    assert (proxy.refused[ONCE], proxy.refused[FIRST_OF_3]) == (1, 2)  # the failing sample and its one retry
    timing = flaky.meta_info["timing"]
    gym = f"nemo_gym/{SIMPLEQA}/"
    counts = {key: timing[gym + key] for key in ("episodes", "failed", "failed/judge_failed", "retried", "recovered")}
    assert counts == {"episodes": 6, "failed": 1, "failed/judge_failed": 1, "retried": 2, "recovered": 1}
    assert timing[f"{gym}reward/mean"] == 1.0  # the reward the user reads leaves the masked sample out
    assert flaky.batch["response_mask"].sum(-1).tolist().count(0) == 1  # nothing of it is trained


def test_a_masked_judge_failure_leaves_its_siblings_advantages_those_of_the_valid_samples(url_judged):
    """verl's GRPO over the batch as the trainer computes it (`nemo_gym_grpo`, the recipe's estimator), against verl's
    own GRPO over the valid samples alone, and over all of them with the failed one scored 0."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn

    flaky = url_judged.flaky
    rewards, mask = flaky.batch["rm_scores"], flaky.batch["response_mask"]
    uids = url_judged.flaky_uids
    advantages, _ = get_adv_estimator_fn("nemo_gym_grpo")(  # registered by the manager, as in verl's TaskRunner
        token_level_rewards=rewards, response_mask=mask, config={"norm_adv_by_std_in_grpo": True}, index=uids
    )
    advantages = advantages[:, 0]  # an outcome advantage: one value per row, on every trained token
    scores = rewards.sum(-1)
    valid = (mask.sum(-1) > 0).numpy()
    assert valid.tolist().count(False) == 1
    expected, _ = compute_grpo_outcome_advantage(
        scores[valid].unsqueeze(-1), torch.ones(int(valid.sum()), 1), uids[valid], norm_adv_by_std_in_grpo=True
    )
    assert torch.allclose(advantages[valid], expected.squeeze(-1), atol=1e-6), (advantages, expected)
    assert advantages[~valid].tolist() == [0.0]
    counted, _ = compute_grpo_outcome_advantage(
        scores.unsqueeze(-1), torch.ones(len(scores), 1), uids, norm_adv_by_std_in_grpo=True
    )
    siblings = valid & (uids == uids[~valid][0])
    # Counted as a 0, the failed sample would have pushed its siblings' advantages up.
    assert (counted.squeeze(-1)[siblings] > 0).all() and (advantages[siblings] == 0).all()


def test_a_judge_request_over_the_judges_context_fails_the_episode_instead_of_scoring_0(url_judged):
    (result,) = url_judged.overlong_results
    assert isinstance(result, EpisodeFailure) and result.cause is FailureCause.JUDGE_FAILED, result
    assert url_judged.proxy.refused[CONTEXT] >= 2  # the episode's judge calls, and its retry's
    timing = url_judged.overlong.meta_info["timing"]
    assert timing[f"nemo_gym/{MULTICHALLENGE}/failed/judge_failed"] == 1
    assert url_judged.overlong.batch["response_mask"].sum().item() == 0
