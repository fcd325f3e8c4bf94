# SPDX-License-Identifier: Apache-2.0
"""The failure budget: ceil(max_fraction x batch) failed episodes pass, one more fails the step with a summary."""

from __future__ import annotations

import pytest

from recipe.nemo_gym.failures import EpisodeFailure, FailureBudget, FailureBudgetExceeded, FailureCause


def failures(n: int, cause: FailureCause = FailureCause.SERVER_ERROR) -> list[EpisodeFailure]:
    return [EpisodeFailure(cause, f"detail {i}", row=i) for i in range(n)]


@pytest.mark.parametrize("batch_size", [1, 2, 8, 16, 19, 20])
def test_default_budget_tolerates_one_failure_in_any_batch_up_to_twenty_episodes(batch_size):
    budget = FailureBudget(0.05)
    assert budget.allowed(batch_size) == 1
    budget.check(failures(1), batch_size)  # the old `failures > 0.05 x batch` rule failed every batch under 20
    with pytest.raises(FailureBudgetExceeded):
        budget.check(failures(2), batch_size)


@pytest.mark.parametrize(
    ("max_fraction", "batch_size", "allowed"),
    [
        (0.05, 21, 2),  # 1.05 rounded up
        (0.05, 1024, 52),  # 51.2 rounded up
        (0.07, 100, 7),  # 7.000000000000001 in binary: no eighth episode
        (0.1, 30, 3),
        (0.5, 8, 4),
        (1.0, 8, 8),
        (0.0, 1024, 0),
        (0.05, 0, 0),
    ],
)
def test_allowed_is_max_fraction_of_the_batch_rounded_up(max_fraction, batch_size, allowed):
    assert FailureBudget(max_fraction).allowed(batch_size) == allowed


def test_zero_fraction_tolerates_no_failure_and_one_tolerates_all():
    with pytest.raises(FailureBudgetExceeded):
        FailureBudget(0.0).check(failures(1), 1000)
    FailureBudget(0.0).check([], 1000)
    FailureBudget(1.0).check(failures(8), 8)


def test_over_budget_message_names_the_allowance_and_counts_by_cause():
    batch = failures(2, FailureCause.CONTIGUITY_BROKEN) + failures(1, FailureCause.SERVER_ERROR)
    with pytest.raises(FailureBudgetExceeded) as err:
        FailureBudget(0.05).check(batch, 16)
    lines = str(err.value).splitlines()
    assert lines[0] == (
        "3 of 16 episodes failed, over the budget of 1 (failures.max_fraction 5.0% of 16, rounded up). By cause: "
        "server_error (infrastructure) = 1, contiguity_broken (data) = 2."
    )
    assert lines[1:] == ["First failures:"] + [f"  {f}" for f in batch]


def test_budget_rejects_fractions_outside_zero_to_one():
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
            FailureBudget(bad)


# ---------------------------------------------------------------------- failures NeMo Gym reports on a row


def test_gym_failure_rows_become_typed_failures_with_their_details():
    from recipe.nemo_gym.gym.over_http.outcomes import reported_failure

    failed = {
        "_ng_failure_class": "environment_server_failed",
        "_ng_failure_type": "ClientResponseError",
        "_ng_failure_message": "500, message='Internal Server Error'",
        "_ng_failure_http_status": 500,
        "_ng_failure_response_body": "not shown",
        "reward": 0.0,  # a failure row's reward is no reward: never trained as 0
    }
    assert reported_failure(3, "math_environment_server", failed) == EpisodeFailure(
        FailureCause.ENVIRONMENT_FAILED,
        "'math_environment_server' /run reported failure class 'environment_server_failed' (type=ClientResponseError, "
        "message=500, message='Internal Server Error', http_status=500)",
        row=3,
    )
    assert reported_failure(0, "env", {"_ng_failure_class": "cancelled", "_ng_failure_message": ""}) == EpisodeFailure(
        FailureCause.CANCELLED, "'env' /run reported failure class 'cancelled'", row=0
    )
    assert reported_failure(1, "env", {"mask_sample": True, "reward": 1.0}) == EpisodeFailure(
        FailureCause.MASKED_BY_ENVIRONMENT,
        "'env' /run marked the episode mask_sample (the environment asks not to train on it)",
        row=1,
    )
    assert reported_failure(2, "env", {"mask_sample": False, "_ng_failure_class": None, "reward": 1.0}) is None
    # Gym 0.7's judge_failsafe row: mask_sample set too, the failure class decides.
    judge_failed = {"_ng_failure_class": "judge_failed", "mask_sample": True, "reward": 0.0}
    assert reported_failure(4, "simpleqa", judge_failed) == EpisodeFailure(
        FailureCause.JUDGE_FAILED, "'simpleqa' /run reported failure class 'judge_failed'", row=4
    )


def test_gym_reported_failures_are_infrastructure_except_an_environments_own_mask():
    assert FailureCause.ENVIRONMENT_FAILED.kind.value == "infrastructure"
    assert FailureCause.CANCELLED.kind.value == "infrastructure"
    assert FailureCause.JUDGE_FAILED.kind.value == "infrastructure"
    assert FailureCause.MASKED_BY_ENVIRONMENT.kind.value == "data"


def _math_result(text: str, *, reward: float, extracted, library: float, judge=None) -> dict:
    """A `math_with_judge` /run result as NeMo Gym returns it (the verify response's fields)."""
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {
        "response": {"output": [{"type": "reasoning", "summary": []}, message]},
        "reward": reward,
        "expected_answer": "32",
        "extracted_answer": extracted,
        "library_reward": library,
        "judge_evaluations": judge,
    }


def test_a_boxed_answer_scored_zero_without_an_extracted_answer_is_a_missing_verdict_not_a_zero():
    from recipe.nemo_gym.gym.over_http.outcomes import missing_verdict_failure

    failure = missing_verdict_failure(
        5, "math_with_judge", _math_result("The answer is \\boxed{32}.", reward=0.0, extracted=None, library=0.0)
    )
    assert failure == EpisodeFailure(
        FailureCause.ENVIRONMENT_FAILED,
        "'math_with_judge' scored a \\boxed{} answer 0 without extracting it: its math-verify check gave no verdict "
        "(timed out or failed; see docs/troubleshooting.md, 'A correct math answer scored 0')",
        row=5,
    )
    assert failure.cause.retryable


@pytest.mark.parametrize(
    "result",
    [
        _math_result("The answer is \\boxed{31}.", reward=0.0, extracted="31", library=0.0),  # a verdict: wrong
        _math_result("The answer is \\boxed{32}.", reward=1.0, extracted="32", library=1.0),  # a verdict: right
        _math_result("The answer is \\boxed{32}.", reward=1.0, extracted=None, library=1.0),  # right, not printed
        _math_result("I do not know.", reward=0.0, extracted=None, library=0.0),  # nothing to extract: a verdict
        _math_result("The answer is \\boxed{}.", reward=0.0, extracted=None, library=0.0),  # an empty box
        _math_result("\\boxed{32}", reward=0.0, extracted=None, library=0.0, judge=[{"x": 1}]),  # the judge decided
        {"response": {"output": []}, "reward": 0.0},  # not math_with_judge
    ],
)
def test_results_with_a_verdict_are_left_alone(result):
    from recipe.nemo_gym.gym.over_http.outcomes import missing_verdict_failure

    assert missing_verdict_failure(0, "math_with_judge", result) is None


def test_the_manager_reads_a_run_without_a_math_verdict_as_a_failure():
    """`make_post_run` (what the manager posts each row with) against an HTTP server answering `/run` the way
    `math_with_judge_simple_agent` does: a verdict-less 0 comes back as the row's failure, a verdict as the result."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from recipe.nemo_gym.gym.over_http.client import RunTarget, make_post_run
    from recipe.nemo_gym.gym.replicas import LeastBusy
    from tests.support.helpers import free_port

    answers = iter(
        [
            _math_result("The answer is \\boxed{32}.", reward=0.0, extracted=None, library=0.0),
            _math_result("The answer is \\boxed{31}.", reward=0.0, extracted="31", library=0.0),
        ]
    )

    async def run(request: web.Request) -> web.Response:
        return web.json_response(next(answers))

    async def main():
        app = web.Application()
        app.router.add_post("/run", run)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session:
                agent = "math_with_judge_simple_agent"
                router = LeastBusy({agent: (RunTarget(agent, f"http://127.0.0.1:{port}"),)})
                post_run = make_post_run(session, router)
                row = {"agent_ref": {"name": agent}, "responses_create_params": {"input": []}}
                return await post_run(7, row), await post_run(8, row)
        finally:
            await runner.cleanup()

    missing, wrong = asyncio.run(main())
    assert isinstance(missing, EpisodeFailure) and missing.cause is FailureCause.ENVIRONMENT_FAILED
    assert missing.row == 7 and "without extracting it" in missing.detail
    assert isinstance(wrong, dict) and wrong["extracted_answer"] == "31"
