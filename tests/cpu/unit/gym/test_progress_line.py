# SPDX-License-Identifier: Apache-2.0
"""The progress line a batch logs while NeMo Gym runs it (`gym.collect.ProgressLine`, `run_examples_in_order`)."""

from __future__ import annotations

import asyncio
import logging

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause
from recipe.nemo_gym.gym.over_http.collect import ProgressLine, run_examples_in_order


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_line_logs_at_most_once_per_interval_and_always_the_last_episode(plugin_caplog):
    clock = FakeClock()
    line = ProgressLine(interval_s=10.0, clock=clock)
    with plugin_caplog.at_level(logging.WARNING, logger="recipe.nemo_gym.gym.over_http.collect"):
        clock.now = 105.0
        line(1, 0, 4)  # 5 s in: too soon
        clock.now = 111.0
        line(2, 1, 4)  # 11 s in: logged
        clock.now = 112.0
        line(3, 1, 4)  # 1 s after the last line: too soon
        line(4, 1, 4)  # the last episode: always logged
    assert [r.getMessage() for r in plugin_caplog.records] == [
        "NeMo Gym rollout: 2/4 episodes done (1 failed), 11 s",
        "NeMo Gym rollout: 4/4 episodes done (1 failed), 12 s",
    ]


def test_the_last_line_says_how_the_rows_were_spread_over_agent_copies(plugin_caplog):
    clock = FakeClock()
    line = ProgressLine(interval_s=10.0, clock=clock, finished=lambda: "a on 2 copies: 2, 1 runs")
    with plugin_caplog.at_level(logging.WARNING, logger="recipe.nemo_gym.gym.over_http.collect"):
        clock.now = 111.0
        line(1, 0, 3)  # not the last: no spread yet
        line(3, 0, 3)
    assert [r.getMessage() for r in plugin_caplog.records] == [
        "NeMo Gym rollout: 1/3 episodes done (0 failed), 11 s",
        "NeMo Gym rollout: 3/3 episodes done (0 failed), 11 s; a on 2 copies: 2, 1 runs",
    ]


def test_batch_reports_progress_with_failures_counted_until_every_episode_is_done():
    calls: list[tuple[int, int, int]] = []

    async def post_run(index, row):
        await asyncio.sleep(0.05 * index)
        if index == 1:
            return EpisodeFailure(FailureCause.SERVER_ERROR, "500", row=index)
        return {"reward": 1.0}

    outcomes = asyncio.run(
        run_examples_in_order(
            [{}, {}, {}], post_run, deadline_s=30.0, health_check_interval_s=5.0, progress=lambda *a: calls.append(a)
        )
    )
    assert isinstance(outcomes[1], EpisodeFailure)
    assert calls[-1] == (3, 1, 3)
    assert [done for done, _, _ in calls] == sorted(done for done, _, _ in calls)
    assert all(total == 3 for _, _, total in calls)


def test_while_a_policy_server_fails_its_probes_the_line_says_what_the_batch_waits_for(plugin_caplog):
    from recipe.nemo_gym.gym.over_http.health import PolicyWatch, ProbeResult

    clock = FakeClock()
    url = "http://10.0.0.5:8000"
    watch = PolicyWatch([url], timeout_s=1.0, max_failures=3)
    line = ProgressLine(interval_s=10.0, clock=clock, waiting_on=watch.waiting_on)
    with plugin_caplog.at_level(logging.WARNING, logger="recipe.nemo_gym.gym.over_http.collect"):
        clock.now = 111.0
        line(1, 0, 4)
        watch.record([ProbeResult(url, False, "connection refused")], now=clock.now)
        watch.record([ProbeResult(url, False, "connection refused")], now=clock.now)
        clock.now = 122.0
        line(1, 0, 4)
        watch.record([ProbeResult(url, True, "")], now=clock.now)  # it answered again
        clock.now = 133.0
        line(2, 0, 4)
    assert [r.getMessage() for r in plugin_caplog.records] == [
        "NeMo Gym rollout: 1/4 episodes done (0 failed), 11 s",
        "NeMo Gym rollout: 1/4 episodes done (0 failed), 22 s; waiting: policy server http://10.0.0.5:8000 "
        "(2 of 3 probes unanswered) not answering",
        "NeMo Gym rollout: 2/4 episodes done (0 failed), 33 s",
    ]
