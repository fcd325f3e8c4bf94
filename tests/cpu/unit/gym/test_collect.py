# SPDX-License-Identifier: Apache-2.0
"""A batch's rows checked and run in order under a deadline (`gym/over_http/collect.py`), without a server: the one
check of the rows, input order restored, failures kept per row, the deadline, the health check's interval, a dead
server named."""

from __future__ import annotations

import asyncio

import pytest

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.errors import GymServerDied
from recipe.nemo_gym.gym.over_http.collect import run_examples_in_order, validate_examples
from tests.support.gym_runtime import stub_math_row as math_row


def test_validate_examples_names_every_bad_row_in_one_error() -> None:
    good = math_row("q", "1", answer="1")
    agents = {"math_with_judge_simple_agent"}
    assert validate_examples([good, good], agents) == ["math_with_judge_simple_agent"] * 2
    no_agent = {k: v for k, v in good.items() if k != "agent_ref"}
    no_params = {"agent_ref": {"name": "math_with_judge_simple_agent"}}
    with pytest.raises(ValueError) as err:
        validate_examples([good, no_agent, good | {"agent_ref": {"name": "other"}}, no_params, "text"], agents)
    assert str(err.value) == (
        "4 of 5 rows cannot run on the agents of this NeMo Gym configuration "
        "(configured agents: ['math_with_judge_simple_agent']); nothing was sent: "
        "row 1: missing agent_ref.name (the agent server that runs the episode); "
        "row 2: agent_ref.name 'other' is not configured; row 3: missing responses_create_params; "
        "row 4: expected a mapping, got str"
    )


def test_validate_examples_uses_the_callers_row_labels_and_shows_ten() -> None:
    rows = [{"agent_ref": {"name": f"a{i}"}, "responses_create_params": {}} for i in range(12)]
    labels = [f"batch row {i} (dataset index {100 + i})" for i in range(12)]
    with pytest.raises(ValueError) as err:
        validate_examples(rows, {"a0"}, labels=labels, config="plugin.yaml")
    message = str(err.value)
    assert message.startswith("11 of 12 rows cannot run on the agents of plugin.yaml (configured agents: ['a0'])")
    assert "batch row 1 (dataset index 101): agent_ref.name 'a1' is not configured" in message
    assert "batch row 10 (dataset index 110)" in message and "batch row 11 " not in message
    assert message.endswith("; and 1 more")


# ------------------------------------------------------------------------- ordering, deadline, health core


def test_run_examples_in_order_restores_input_order_and_keeps_failures_per_row() -> None:
    rows = [{"id": i} for i in range(5)]
    completion = []

    async def post_run(i: int, row: dict) -> dict | EpisodeFailure:
        await asyncio.sleep(0.05 * (5 - i))  # finish in reverse order
        completion.append(i)
        if i == 2:
            return EpisodeFailure(FailureCause.SERVER_ERROR, "HTTP 500", row=i)
        return {"echo": row["id"]}

    out = asyncio.run(run_examples_in_order(rows, post_run, deadline_s=10, health_check_interval_s=1.0))
    assert completion == [4, 3, 2, 1, 0]
    assert out == [
        {"echo": 0},
        {"echo": 1},
        EpisodeFailure(FailureCause.SERVER_ERROR, "HTTP 500", row=2),
        {"echo": 3},
        {"echo": 4},
    ]


def test_run_examples_in_order_deadline_cancels_pending_and_counts_them() -> None:
    cancelled = []

    async def post_run(i: int, row: dict) -> dict:
        try:
            await asyncio.sleep(0 if i == 0 else 60)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return {}

    with pytest.raises(RolloutAborted, match=r"deadline of 0.3s with 2 of 3 episodes pending \(rows 1, 2\)"):
        asyncio.run(run_examples_in_order([{}, {}, {}], post_run, deadline_s=0.3, health_check_interval_s=0.1))
    assert sorted(cancelled) == [1, 2]


def test_run_examples_in_order_checks_health_once_per_interval_however_often_rows_finish() -> None:
    # 60 rows ending 10 ms apart wake the wait loop about 60 times in 0.6 s; the health check (an HTTP probe of
    # every policy server and a read of Gym's process table) must still run only once per interval.
    checked: list[float] = []

    async def health() -> None:
        checked.append(asyncio.get_running_loop().time())

    async def post_run(i: int, row: dict) -> dict:
        await asyncio.sleep(0.01 * (i + 1))
        return {"i": i}

    rows = [{} for _ in range(60)]
    out = asyncio.run(
        run_examples_in_order(rows, post_run, deadline_s=30, health_check=health, health_check_interval_s=0.1)
    )
    assert out == [{"i": i} for i in range(60)]
    gaps = [b - a for a, b in zip(checked, checked[1:], strict=False)]
    assert len(checked) >= 3, checked  # before the first request, then while rows are pending
    assert min(gaps) >= 0.1 - 1e-6, gaps  # (the tolerance: float subtraction of the loop's clock)

    checked.clear()
    asyncio.run(run_examples_in_order(rows, post_run, deadline_s=30, health_check=health, health_check_interval_s=10))
    assert len(checked) == 1  # the batch ends before its first interval does


def test_run_examples_in_order_aborts_naming_the_dead_server() -> None:
    calls = []

    def health() -> None:
        calls.append(1)
        if len(calls) >= 3:
            raise GymServerDied("NeMo Gym server 'math_with_judge': process killed by signal 9.", ["math_with_judge"])

    async def post_run(i: int, row: dict) -> dict:
        await asyncio.sleep(60)
        return {}

    with pytest.raises(RolloutAborted, match=r"\['math_with_judge'\] died with 2 of 2 episodes pending"):
        asyncio.run(
            run_examples_in_order([{}, {}], post_run, deadline_s=30, health_check=health, health_check_interval_s=0.05)
        )
