# SPDX-License-Identifier: Apache-2.0
"""Retries of failed episodes inside one batch (`gym.collect.run_examples_in_order`, `failures.retries`).

`post_run` here is a scripted coroutine standing in for the HTTP post to an agent's `/run` (the function the batch
loop is given); the real post runs against NeMo Gym's servers in tests/cpu/e2e/test_job_failures.py.
"""

from __future__ import annotations

import asyncio

import pytest

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.over_http.collect import run_examples_in_order


def scripted(outcomes_per_row: dict[int, list]):
    """A post_run that answers row i's k-th post with outcomes_per_row[i][k] (the last one repeats); records posts."""
    posts: list[int] = []

    async def post_run(index, row):
        posts.append(index)
        script = outcomes_per_row.get(index, [{"reward": 1.0}])
        outcome = script[min(posts.count(index) - 1, len(script) - 1)]
        if isinstance(outcome, float):  # a delay, then success
            await asyncio.sleep(outcome)
            return {"reward": 1.0}
        return outcome(index) if callable(outcome) else outcome

    return post_run, posts


def failure(cause: FailureCause):
    return lambda row: EpisodeFailure(cause, f"{cause.value} on row {row}", row=row)


def run(post_run, n, *, retries, deadline_s=30.0, retry_delay_s=0.0):
    attempts = [1] * n
    outcomes = asyncio.run(
        run_examples_in_order(
            [{}] * n,
            post_run,
            deadline_s=deadline_s,
            health_check_interval_s=0.05,
            retries=retries,
            retry_delay_s=retry_delay_s,
            attempts=attempts,
        )
    )
    return outcomes, attempts


def test_an_infrastructure_failure_is_retried_and_the_retry_is_kept():
    post_run, posts = scripted({1: [failure(FailureCause.SERVER_ERROR), {"reward": 0.5}]})
    outcomes, attempts = run(post_run, 3, retries=1)
    assert outcomes == [{"reward": 1.0}, {"reward": 0.5}, {"reward": 1.0}]
    assert attempts == [1, 2, 1]
    assert sorted(posts) == [0, 1, 1, 2]


@pytest.mark.parametrize(
    "cause", [FailureCause.SERVER_ERROR, FailureCause.ENVIRONMENT_FAILED, FailureCause.CANCELLED], ids=str
)
def test_a_persistent_infrastructure_failure_is_tried_retries_plus_one_times_then_kept(cause):
    post_run, posts = scripted({0: [failure(cause)]})
    outcomes, attempts = run(post_run, 2, retries=2)
    assert outcomes[0] == EpisodeFailure(cause, f"{cause.value} on row 0", row=0)
    assert attempts == [3, 1] and posts.count(0) == 3


@pytest.mark.parametrize(
    "cause",
    [c for c in FailureCause if not c.retryable],
    ids=str,
)
def test_data_causes_and_the_environments_mask_are_never_retried(cause):
    post_run, posts = scripted({0: [failure(cause), {"reward": 1.0}]})
    outcomes, attempts = run(post_run, 1, retries=3)
    assert isinstance(outcomes[0], EpisodeFailure) and outcomes[0].cause is cause
    assert attempts == [1] and posts == [0]


def test_retryable_causes_are_exactly_the_infrastructure_ones():
    assert {c for c in FailureCause if c.retryable} == {
        FailureCause.SERVER_ERROR,
        FailureCause.ENVIRONMENT_FAILED,
        FailureCause.JUDGE_FAILED,
        FailureCause.CANCELLED,
    }


def test_no_retry_with_retries_zero():
    post_run, posts = scripted({0: [failure(FailureCause.SERVER_ERROR), {"reward": 1.0}]})
    outcomes, attempts = run(post_run, 1, retries=0)
    assert isinstance(outcomes[0], EpisodeFailure) and attempts == [1] and posts == [0]


def test_a_retry_the_deadline_cuts_keeps_its_failure_and_the_batch_returns():
    # Row 0 fails at once and its retry hangs; row 1 succeeds. The deadline masks row 0 instead of aborting.
    post_run, _ = scripted({0: [failure(FailureCause.SERVER_ERROR), 60.0]})
    outcomes, attempts = run(post_run, 2, retries=1, deadline_s=0.5)
    assert outcomes[1] == {"reward": 1.0}
    assert outcomes[0] == EpisodeFailure(
        FailureCause.SERVER_ERROR, "server_error on row 0 (its retry was cut by the batch deadline)", row=0
    )
    assert attempts == [2, 1]


def test_a_first_run_the_deadline_cuts_still_aborts_the_batch_naming_it():
    post_run, _ = scripted({0: [failure(FailureCause.SERVER_ERROR), 60.0], 1: [60.0]})
    with pytest.raises(RolloutAborted, match=r"with 1 of 2 episodes pending \(rows 1\)"):
        run(post_run, 2, retries=1, deadline_s=0.5)


def test_the_retry_waits_retry_delay_s():
    post_run, _ = scripted({0: [failure(FailureCause.SERVER_ERROR), {"reward": 1.0}]})
    loop = asyncio.new_event_loop()
    try:
        started = loop.time()
        loop.run_until_complete(
            run_examples_in_order(
                [{}], post_run, deadline_s=10.0, health_check_interval_s=1.0, retries=1, retry_delay_s=0.3
            )
        )
        assert loop.time() - started >= 0.3
    finally:
        loop.close()
