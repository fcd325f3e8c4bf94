# SPDX-License-Identifier: Apache-2.0
"""Collect processes (`recipe/nemo_gym/gym/over_http/collect_processes.py`): rows posted and results read into
episodes by real child processes, under `collect.run_examples_in_order` as the manager runs it.

The agents here are small aiohttp servers in this process that answer `/run` with results in NeMo Gym's shape
(`tests.support.results.synthetic_result`): a stand-in for Gym's agent servers, which would cost a Gym stack. The
real Gym and `main_ppo` run with collect processes in `tests/cpu/e2e/test_two_nodes.py` (attach mode, two nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import numpy as np
import psutil
import pytest

from recipe.nemo_gym.failures import EpisodeFailure, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.over_http.client import RunTarget
from recipe.nemo_gym.gym.over_http.collect import run_examples_in_order
from recipe.nemo_gym.gym.over_http.collect_processes import CollectProcesses, frame, read_frame, split_limits
from recipe.nemo_gym.gym.over_http.limits import LIMIT_KEY, LIMIT_PER_HOST_KEY
from recipe.nemo_gym.gym.replicas import LeastBusy, replica_groups
from recipe.nemo_gym.gym.types import CollectSettings
from recipe.nemo_gym.packing.episode import Episode, read_episode
from tests.support.helpers import free_port
from tests.support.results import synthetic_result

AGENT = "uppercase_agent"


def result_for(index: int) -> dict:
    """Row `index`'s result: two model calls around a tool call, its tokens and reward derived from the index."""
    first = [100 + index, 101, 102]
    generated = [200 + index, 201]
    second = first + generated + [300, 301]
    return synthetic_result(
        [(first, generated, [-0.5, -0.25]), (second, [400 + index], [-0.125])],
        reward=index / 10,
        agent_name=AGENT,
    )


def rows(n: int, **extra) -> list[dict]:
    return [{"agent_ref": {"name": AGENT}, "responses_create_params": {"input": []}, **extra} for _ in range(n)]


def test_connector_limits_are_split_among_the_children_at_least_one_each():
    assert split_limits({LIMIT_KEY: 100, LIMIT_PER_HOST_KEY: 0}, 3) == {LIMIT_KEY: 33, LIMIT_PER_HOST_KEY: 0}
    assert split_limits({LIMIT_KEY: 2, LIMIT_PER_HOST_KEY: 10}, 4) == {LIMIT_KEY: 1, LIMIT_PER_HOST_KEY: 2}
    assert split_limits({}, 2) == {LIMIT_KEY: 50, LIMIT_PER_HOST_KEY: 0}  # aiohttp's default total, no per-host cap
    with pytest.raises(ValueError, match="at least one"):
        CollectProcesses(CollectSettings(0), {})


def test_a_frame_carries_one_message_and_a_closed_stream_ends_the_reading():
    async def main():
        reader = asyncio.StreamReader()
        message = ("run", 7, {"tokens": np.arange(5)})
        reader.feed_data(frame(message) + frame(("cancel", 7, None)))
        reader.feed_eof()
        first, second = await read_frame(reader), await read_frame(reader)
        with pytest.raises(asyncio.IncompleteReadError):
            await read_frame(reader)
        return first, second

    first, second = asyncio.run(main())
    assert first[:2] == ("run", 7) and first[2]["tokens"].tolist() == [0, 1, 2, 3, 4]
    assert second == ("cancel", 7, None)


def test_a_result_with_a_data_fault_becomes_its_rows_failure():
    good = result_for(3)
    episode = read_episode(good, 3, max_prompt_length=10)
    assert isinstance(episode, Episode) and episode.token_ids.tolist() == [103, 101, 102, 203, 201, 300, 301, 403]
    too_long = read_episode(good, 5, max_prompt_length=2)
    assert isinstance(too_long, EpisodeFailure) and too_long.row == 5
    assert too_long.cause is FailureCause.PROMPT_TOO_LONG
    missing = read_episode(good, 6, required_components=("style",))
    assert isinstance(missing, EpisodeFailure) and missing.cause is FailureCause.BAD_REWARD and missing.row == 6


class Agents:
    """Two HTTP servers standing for two copies of one agent: `/run` answers row i with `result_for(i)` after
    `delay_s`, an HTTP 500 for a row marked `fail`, and never for a row marked `hang`. `seen` records which copy
    got which row, and `hanging` how many requests still wait unanswered."""

    def __init__(self, delay_s: float = 0.05):
        self.delay_s = delay_s
        self.seen: dict[str, list[int]] = {}
        self.hanging = 0
        self.runners = []
        self.targets: dict[str, RunTarget] = {}

    async def __aenter__(self) -> Agents:
        from aiohttp import web

        for name in (AGENT, f"{AGENT}__replica2"):
            self.seen[name] = []

            async def run(request: web.Request, name: str = name) -> web.Response:
                row = json.loads(await request.read())
                index = row["_ng_task_index"]
                self.seen[name].append(index)
                if row.get("hang"):
                    self.hanging += 1
                    try:
                        await asyncio.sleep(3600)
                    finally:
                        self.hanging -= 1
                await asyncio.sleep(self.delay_s)
                if row.get("fail"):
                    return web.json_response({"detail": "boom"}, status=500)
                return web.json_response(result_for(index))

            application = web.Application()
            application.router.add_post("/run", run)
            # A client that goes away cancels its request's handler (aiohttp's default since 3.9 is not to).
            runner = web.AppRunner(application, handler_cancellation=True, shutdown_timeout=1.0)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)
            self.targets[name] = RunTarget(name, f"http://127.0.0.1:{port}")
        return self

    async def __aexit__(self, *exc) -> None:
        for runner in self.runners:
            await runner.cleanup()

    def router(self) -> LeastBusy:
        return LeastBusy(replica_groups(self.targets))


@contextlib.asynccontextmanager
async def started(connector_limits: dict | None = None):
    """Two collect processes (reading with a prompt length of 10) and the two agent copies, stopped after."""
    processes = CollectProcesses(CollectSettings(2, max_prompt_length=10), connector_limits or {})
    async with Agents() as agents:
        await processes.start()
        try:
            yield processes, agents
        finally:
            await processes.close()


def run_batch(processes: CollectProcesses, agents: Agents, examples: list[dict], deadline_s: float = 60.0, **kw):
    return run_examples_in_order(
        examples,
        post_run=processes.post_run(agents.router()),
        deadline_s=deadline_s,
        health_check_interval_s=0.5,
        **kw,
    )


def test_rows_come_back_as_episodes_in_input_order_from_every_child_and_every_copy():
    async def main():
        async with started({LIMIT_KEY: 100}) as (processes, agents):
            examples = rows(12)
            examples[5] = {**examples[5], "fail": True}
            outcomes = await run_batch(processes, agents, examples)
            children = [psutil.Process(pid) for pid in processes.pids]
            # Both children hold connections to the agents: each posted rows.
            connected = [{c.raddr.port for c in child.net_connections("tcp") if c.raddr} for child in children]
        return outcomes, agents.seen, connected, children

    outcomes, seen, connected, children = asyncio.run(main())
    for index, outcome in enumerate(outcomes):
        if index == 5:
            assert isinstance(outcome, EpisodeFailure) and outcome.row == 5
            assert outcome.cause is FailureCause.SERVER_ERROR and "HTTP 500" in str(outcome)
            continue
        expected = read_episode(result_for(index), index, max_prompt_length=10)
        assert isinstance(outcome, Episode), outcome
        assert outcome.token_ids.tolist() == expected.token_ids.tolist()
        assert outcome.response_mask.tolist() == [True, True, False, False, True]
        assert outcome.response_log_probs.tolist() == [-0.5, -0.25, 0.0, 0.0, -0.125]
        assert outcome.reward == index / 10 and outcome.segments == expected.segments
    assert sorted(seen[AGENT] + seen[f"{AGENT}__replica2"]) == list(range(12))
    assert len(seen[AGENT]) == len(seen[f"{AGENT}__replica2"]) == 6
    assert all(connected), connected
    assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)


def test_the_deadline_cancels_a_rows_request_in_its_child_and_the_children_serve_the_next_batch():
    async def main():
        async with started() as (processes, agents):
            with pytest.raises(RolloutAborted, match=r"deadline of 1s with 1 of 3 episodes pending \(rows 1\)"):
                await run_batch(processes, agents, [*rows(1), *rows(1, hang=True), *rows(1)], deadline_s=1.0)
            # The cancellation reached the child, which closed the request: the agent stops waiting on it.
            for _ in range(50):
                if agents.hanging == 0:
                    break
                await asyncio.sleep(0.1)
            hanging = agents.hanging
            again = await run_batch(processes, agents, rows(4))
        return hanging, again

    hanging, again = asyncio.run(main())
    assert hanging == 0
    assert [type(o) for o in again] == [Episode] * 4


def test_a_child_that_dies_mid_batch_aborts_it_naming_its_pid_and_status_and_the_rest_carry_on():
    async def main():
        async with started() as (processes, agents):
            victim = processes.pids[0]
            batch = asyncio.ensure_future(run_batch(processes, agents, rows(4, hang=True)))
            while agents.hanging < 4:
                await asyncio.sleep(0.05)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            with pytest.raises(RolloutAborted) as aborted:
                await batch
            took = time.monotonic() - killed_at
            after = await run_batch(processes, agents, rows(3))
        return victim, str(aborted.value), took, after

    victim, message, took, after = asyncio.run(main())
    assert f"the manager's collect process {victim} was killed by SIGKILL with 2 rows in flight" in message
    assert took < 10
    assert [type(o) for o in after] == [Episode] * 3  # the other child took the next batch


def test_closing_stops_every_child_and_a_child_whose_parent_is_gone_exits_on_its_own():
    async def main():
        processes = CollectProcesses(CollectSettings(2), {})
        await processes.start()
        children = [psutil.Process(pid) for pid in processes.pids]
        # A parent gone without closing: its end of the socket closes with it.
        orphaned = processes._children[1]  # noqa: SLF001 - the test closes one socket as a dead parent's would
        orphaned.writer.transport.abort()
        await asyncio.get_running_loop().run_in_executor(None, orphaned.process.wait, 10)
        await processes.close()
        return children

    children = asyncio.run(main())
    assert [child.is_running() for child in children] == [False, False]


def test_the_setting_is_checked_by_name_and_allowed_with_an_attached_gym(tmp_path):
    from recipe.nemo_gym.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"nemo_gym": {"config_paths": ["a.yaml"]}}))
    assert load_config(path).nemo_gym.collect_processes == 0  # the manager's own loop
    attach = {"attach": {"head_server_url": "http://gym:11000"}, "collect_processes": 4}
    path.write_text(json.dumps({"nemo_gym": attach}))
    assert load_config(path).nemo_gym.collect_processes == 4
    path.write_text(json.dumps({"nemo_gym": {"config_paths": ["a.yaml"], "collect_processes": -1}}))
    with pytest.raises(ConfigError, match=r"nemo_gym\.collect_processes: Input should be greater than or equal to 0"):
        load_config(path)
