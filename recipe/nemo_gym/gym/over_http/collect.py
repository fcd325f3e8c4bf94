# SPDX-License-Identifier: Apache-2.0
"""Rows posted to their agents' `/run`, outcomes returned in input order, under a deadline and health checks.

Contract:
- `run_examples_in_order(examples, post_run, deadline_s, ...)` runs `post_run(index, row)` for every row
  concurrently and returns one `RowOutcome` per row, in input order: the agent's result dict, or the
  `EpisodeFailure` that `post_run` decided (`client.make_post_run`, with the causes of `outcomes.py`). A dead NeMo Gym
  server, an unreachable policy server (the health check raises) or an expired deadline cancels every pending
  request and raises `RolloutAborted` naming the servers or the pending rows.
- It runs on the caller's event loop and enters none itself; `GymConnection.collect` awaits it on the loop the
  agent loop manager runs it on.

Rows are posted one by one, each task keeping its row's index, and each to the server Gym's own collector would
post it to (`client.run_targets`): the trainer imports no NeMo Gym code. Nothing in NeMo Gym times out (its
model server retries a policy server that does not answer every 0.5 s forever, 0.4.0 to 0.7.0), hence the
batch deadline and the health checks while a batch waits. After an abort, Gym's model server may go on retrying
a dead policy server for requests nobody waits for any more; those loops end with Gym's servers
(`OwnedGym.shutdown`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.failures import EpisodeFailure, RolloutAborted
from recipe.nemo_gym.gym.errors import GymServerDied, PolicyServerUnreachable

logger = logging.getLogger(__name__)

# One row's outcome: the agent's `/run` result, or why the row cannot be trained on.
RowOutcome = dict[str, Any] | EpisodeFailure


def validate_examples(
    examples: Sequence[Mapping[str, Any]],
    agent_names: Collection[str],
    *,
    labels: Sequence[str] | None = None,
    config: str = "this NeMo Gym configuration",
) -> list[str]:
    """Each row's agent server name, or one `ValueError` naming every row that cannot run (first 10 shown).

    The one check of a row's `agent_ref.name` against the agents NeMo Gym started, run by `GymConnection.collect` on
    every batch before anything is sent (the manager's `labels` name verl's batch row and dataset index; `config`
    names the Gym's configuration). Nothing has been sent when it raises.
    """
    agents, bad = [], []
    for i, row in enumerate(examples):
        label = labels[i] if labels is not None else f"row {i}"
        if not isinstance(row, Mapping):
            bad.append(f"{label}: expected a mapping, got {type(row).__name__}")
            continue
        agent_ref = row.get("agent_ref")
        name = agent_ref.get("name") if isinstance(agent_ref, Mapping) else None
        if not isinstance(name, str) or not name:
            bad.append(f"{label}: missing agent_ref.name (the agent server that runs the episode)")
        elif name not in agent_names:
            bad.append(f"{label}: agent_ref.name {name!r} is not configured")
        elif "responses_create_params" not in row:
            bad.append(f"{label}: missing responses_create_params")
        agents.append(name)
    if bad:
        shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise ConfigError(
            f"{len(bad)} of {len(examples)} rows cannot run on the agents of {config} "
            f"(configured agents: {sorted(agent_names)}); nothing was sent: {shown}"
        )
    return agents


async def run_examples_in_order(
    examples: Sequence[Mapping[str, Any]],
    post_run: Callable[[int, Mapping[str, Any]], Any],
    deadline_s: float,
    health_check: Callable[[], Any] | None = None,
    *,
    health_check_interval_s: float,
    progress: Callable[[int, int, int], None] | None = None,
    retries: int = 0,
    retry_delay_s: float = 0.0,
    attempts: list[int] | None = None,
) -> list[RowOutcome]:
    """Run `post_run(index, row)` for every row concurrently; return outcomes in input order.

    `progress(done, failed, total)`, when given, is called after every wake-up of the wait loop (at least every
    `health_check_interval_s` while rows are pending, and once when all are done).

    Each row's outcome is tied to its index by the task that ran it, not by a field of the result: in 0.4.0
    no field a caller adds to a row survives into `simple_agent`'s result (its verify response drops them).

    `post_run` returns the row's result dict or an `EpisodeFailure`. `health_check` (a function, or a coroutine
    function) runs before the first request and every `health_check_interval_s` while rows are pending; if it
    raises `GymServerDied`, or `deadline_s` passes, every pending request is cancelled and `RolloutAborted` is
    raised.

    A row whose outcome is a retryable failure (`FailureCause.retryable`: an infrastructure cause) is posted again,
    after `retry_delay_s`, up to `retries` times; its last outcome is kept. `attempts`, when given (one slot per
    row), receives how many times each row was posted. The deadline bounds the retries too: a row still on a retry
    when it passes keeps the failure that made it retry, and only rows still on their first run abort the batch.
    """
    if deadline_s <= 0:
        raise ValueError(f"deadline_s must be positive, got {deadline_s}")
    n = len(examples)
    outcomes: list[RowOutcome | None] = [None] * n
    if n == 0:
        return []

    # The failure a row is being retried for: what it keeps if the deadline cuts the retry.
    retrying: dict[int, EpisodeFailure] = {}

    async def one(i: int) -> RowOutcome:
        outcome = await post_run(i, examples[i])
        runs = 1
        while isinstance(outcome, EpisodeFailure) and outcome.cause.retryable and runs <= retries:
            retrying[i] = outcome
            logger.info("NeMo Gym episode failed and is retried (%d of %d): %s", runs, retries, outcome)
            await asyncio.sleep(retry_delay_s)
            runs += 1
            if attempts is not None:
                attempts[i] = runs
            outcome = await post_run(i, examples[i])
        retrying.pop(i, None)
        return outcome

    loop = asyncio.get_running_loop()
    if health_check is not None:
        await _health_or_abort(health_check, pending=n, total=n)
    # Not `asyncio.timeout`/`TaskGroup`: the wait wakes every interval for health checks and progress, and a row's
    # failure is its outcome, not an exception that should cancel the others. Not `asyncio.wait(FIRST_COMPLETED)`
    # either: it registers and removes a callback on every pending task at each wake-up, O(rows) per finished row.
    # Each task instead reports itself once, when it ends, to `finished`, and the loop takes what is there.
    deadline = loop.time() + deadline_s
    # The health check probes every policy server over HTTP and checks every Gym server (its process, or an attached
    # Gym's over HTTP): once per interval, not at every wake-up. Wake-ups come with every few finished rows, and
    # checking at each cost the loop about 1.1 of its 1.7-1.8 CPU-ms per model call (`bench_load.py --replicas 4`,
    # benchmarks/README.md).
    next_check = loop.time() + health_check_interval_s
    finished: list[asyncio.Task] = []
    woken = asyncio.Event()

    def report(task: asyncio.Task) -> None:
        finished.append(task)
        woken.set()

    tasks: dict[asyncio.Task, int] = {}
    for i in range(n):
        task = asyncio.create_task(one(i), name=f"nemo-gym-row-{i}")
        task.add_done_callback(report)
        tasks[task] = i
    pending = set(tasks)
    failed = 0
    try:
        while pending:
            remaining = deadline - loop.time()
            if remaining <= 0:
                cut = {t for t in pending if tasks[t] in retrying}
                for task in cut:
                    kept = retrying[tasks[task]]
                    outcomes[tasks[task]] = EpisodeFailure(
                        kept.cause, f"{kept.detail} (its retry was cut by the batch deadline)", row=kept.row
                    )
                    task.cancel()
                failed += len(cut)
                if cut:
                    await asyncio.wait(cut, timeout=5.0)
                pending -= cut
                if not pending:
                    break
                rows = sorted(tasks[t] for t in pending)
                shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
                raise RolloutAborted(
                    f"NeMo Gym batch passed its deadline of {deadline_s:g}s with {len(pending)} of {n} episodes "
                    f"pending (rows {shown}); they were cancelled"
                )
            if not finished:
                try:
                    await asyncio.wait_for(woken.wait(), timeout=max(0.0, min(next_check - loop.time(), remaining)))
                except TimeoutError:
                    pass
            woken.clear()
            done = finished.copy()
            finished.clear()
            for task in done:
                if task not in pending:  # a retry cut at the deadline: its outcome is already kept
                    continue
                pending.discard(task)
                outcome = outcomes[tasks[task]] = task.result()
                failed += isinstance(outcome, EpisodeFailure)
            if progress is not None:
                progress(n - len(pending), failed, n)
            if pending and loop.time() >= next_check:
                if health_check is not None:
                    await _health_or_abort(health_check, pending=len(pending), total=n)
                next_check = loop.time() + health_check_interval_s
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
    return outcomes  # type: ignore[return-value]  # every slot is filled once no task is pending


class ProgressLine:
    """Logs "NeMo Gym rollout: <done>/<total> episodes done (<failed> failed), <t> s" while a batch runs.

    At most one line every `interval_s`, plus the line for the last episode, so a long batch shows it is moving
    without flooding the console. While a health check is failing (`waiting_on` returns what it waits for, e.g.
    a policy server that stopped answering), the line says so instead of only counting: "0 failed" would hide a
    batch about to be aborted. The last line adds `finished()` when it says something (how the episodes of agents
    with copies were spread over them). Logged at WARNING level: verl 0.9.1 sets the root logger to WARNING in
    every process, and this line is meant to be seen.
    """

    def __init__(
        self,
        interval_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        waiting_on: Callable[[], str | None] = lambda: None,
        finished: Callable[[], str | None] = lambda: None,
    ):
        self.interval_s = interval_s
        self.clock = clock
        self.waiting_on = waiting_on
        self.finished = finished
        self.started = clock()
        self.last_logged = self.started

    def __call__(self, done: int, failed: int, total: int) -> None:
        now = self.clock()
        if done < total and now - self.last_logged < self.interval_s:
            return
        self.last_logged = now
        if done < total:
            waiting = self.waiting_on()
            tail = f"; waiting: {waiting}" if waiting else ""
        else:
            finished = self.finished()
            tail = f"; {finished}" if finished else ""
        logger.warning(
            "NeMo Gym rollout: %d/%d episodes done (%d failed), %.0f s%s", done, total, failed, now - self.started, tail
        )


async def _health_or_abort(health_check: Callable[[], Any], pending: int, total: int) -> None:
    try:
        outcome = health_check()
        if inspect.isawaitable(outcome):
            await outcome
    except PolicyServerUnreachable as e:
        raise RolloutAborted(
            f"{e.role}(s) {list(e.servers)} unreachable with {pending} of {total} episodes pending (NeMo Gym "
            f"retries an unreachable {e.role} forever, so the batch was aborted):\n{e}"
        ) from e
    except GymServerDied as e:
        raise RolloutAborted(
            f"NeMo Gym server(s) {list(e.servers)} died with {pending} of {total} episodes pending:\n{e}"
        ) from e
