# SPDX-License-Identifier: Apache-2.0
"""`GymConnection`: a running NeMo Gym seen over HTTP, whoever started it: its servers, where each agent's rows go,
and `collect`, which runs a batch of rows against verl's policy servers (`types.PolicyServers`).

Contract:
- The Gym the plugin starts (`owned/launch.py`) and the one it attaches to (`attach.py`) each hold a
  `GymConnection`, built by `GymConnection.adopt` from the head server's configuration and server list: it refuses
  a configuration whose rows could not be run or scored (`GymConfigError`: several environment servers in front
  of one agent, an agent its resources server does not accept) and maps each agent to its `/run` target
  (`client.run_targets`); the rows of an agent with copies are spread over them (`replicas.py`). What differs
  between the two is handed in, not overridden: `check_gym`, the health check of Gym's servers made while a batch
  waits (by process for an owned Gym, by HTTP for an attached one), and `not_before`, the earliest time a row may
  be posted (an attached Gym's model server must first have read the policy address).
- `loop` is the caller's `BackgroundLoop`, borrowed: the aiohttp session rows are posted on is made on it at the
  first `collect`, every `collect` must be awaited on it (anything else raises `RuntimeError` before a request
  goes out), and `close()` closes the session there (skipped once the loop is closed). Once `closed` is set (by
  `close()`, or by the owning Gym as its stop begins), `collect` raises `RolloutAborted`.
- While a batch waits, `collect` runs `check_gym` and probes verl's policy servers and the judge's servers outside
  Gym, `judge_urls` (`health.PolicyWatch`: `timeouts.policy_health_failures` consecutive probes without an answer
  abort the batch, naming the server).
- `collect(..., reading=CollectSettings(processes=N, ...))` posts the rows and reads their results from N collect
  processes (`collect_processes.py`, started at the first such batch, with its settings, and kept until `close()`): each
  outcome is then an `Episode` or an `EpisodeFailure`, never a result dict. Without it (the default) rows are posted on
  the loop and results come back as Gym's dicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from recipe.nemo_gym.config import Timeouts
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import RolloutAborted
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.over_http.client import (
    AGENT_SERVER_TYPE,
    RunTarget,
    ServerInstance,
    client_session,
    make_post_run,
    pairing_problems,
    run_targets,
)
from recipe.nemo_gym.gym.over_http.collect import ProgressLine, RowOutcome, run_examples_in_order, validate_examples
from recipe.nemo_gym.gym.over_http.collect_processes import CollectProcesses
from recipe.nemo_gym.gym.over_http.health import PolicyWatch
from recipe.nemo_gym.gym.replicas import LeastBusy, replica_groups, replica_of
from recipe.nemo_gym.gym.types import CollectSettings, PolicyServers


class GymConnection:
    """A running NeMo Gym over HTTP. Build with `GymConnection.adopt(...)`; see the module docstring."""

    def __init__(
        self,
        loop: BackgroundLoop,
        servers: Sequence[ServerInstance],
        targets: Mapping[str, RunTarget],
        *,
        policy: PolicyServers,
        timeouts: Timeouts,
        check_gym: Callable[[], Awaitable[None]],
        connector_limits: Mapping[str, Any],
        not_before: float = 0.0,
        judge_urls: Sequence[str] = (),
    ):
        self.loop = loop  # borrowed: the caller created it and closes it, after `close()`
        self.servers = tuple(servers)
        self.targets = dict(targets)
        self.policy = policy
        self._timeouts = timeouts
        self._check_gym = check_gym
        self._connector_limits = dict(connector_limits)
        self.not_before = not_before  # monotonic time; rows wait for it (see the module docstring)
        self.judge_urls = tuple(url for url in judge_urls if url not in policy.base_urls)  # a judge outside Gym
        self._session: Any = None
        self.processes: CollectProcesses | None = None  # the collect processes, once a batch has asked for them
        self.router: LeastBusy[RunTarget] | None = None  # the last batch's: how many rows went to each agent copy
        self.closed = False

    @classmethod
    def adopt(
        cls,
        loop: BackgroundLoop,
        config: Mapping[str, Any],
        servers: Sequence[ServerInstance],
        what: str,
        **kwargs: Any,
    ) -> GymConnection:
        """The connection to the Gym whose head server sent `config` and `servers`; `what` names that Gym's
        configuration in errors (its files, or its URL). `kwargs` are the constructor's keywords."""
        try:
            targets = run_targets(config, servers)
        except ValueError as e:
            raise GymConfigError(f"NeMo Gym configuration {what}: {e}") from None
        mismatched = pairing_problems(config)
        if mismatched:
            raise GymConfigError(
                f"NeMo Gym configuration {what}: rows would be scored by a resources server that does not accept "
                "the agent running them: " + "; ".join(mismatched) + ". Use an agent of an accepted type, or set "
                "allow_unsupported_pairing: true in Gym's configuration (Gym's own waiver; in "
                "nemo_gym.config_overrides when the plugin starts Gym)"
            )
        return cls(loop, servers, targets, **kwargs)

    @property
    def agent_names(self) -> frozenset[str]:
        """The agent servers rows can name in `agent_ref.name`: every agent but the copies of another
        (`replicas.py`)."""
        names = {s.name for s in self.servers if s.server_type == AGENT_SERVER_TYPE}
        return frozenset(name for name in names if replica_of(name) not in names)

    async def collect(
        self,
        examples: Sequence[Mapping[str, Any]],
        deadline_s: float,
        health_check_interval_s: float,
        *,
        retries: int = 0,
        retry_delay_s: float = 0.0,
        attempts: list[int] | None = None,
        reading: CollectSettings | None = None,
        labels: Sequence[str] | None = None,
        config: str = "this NeMo Gym configuration",
    ) -> list[RowOutcome]:
        """Run every row on its agent; results in input order. Await it on `self.loop` (the caller's loop).
        With `reading`, rows are posted and read into episodes by collect processes (see the module docstring).
        Every row is checked first (`collect.validate_examples`, the one check of a row against this Gym's agents;
        `labels` name the rows in its `ConfigError`, `config` the configuration): nothing is sent if one cannot run.

        The times come from the environments file (`timeouts.batch_s`, `timeouts.health_check_interval_s`), and so do
        the retries of a row that failed for an infrastructure cause (`failures.retries`, `failures.retry_delay_s`;
        `attempts` receives each row's number of runs: see `collect.run_examples_in_order`)."""
        if self.closed:
            raise RolloutAborted("NeMo Gym is shut down: no batch can run")
        if asyncio.get_running_loop() is not self.loop.loop:
            raise RuntimeError(
                f"GymConnection.collect must run on the loop it was given ({self.loop.name!r}): its HTTP session is "
                "bound to it; await it there, e.g. `await connection.loop.arun(...)`"
            )
        validate_examples(examples, self.agent_names, labels=labels, config=config)
        wait = self.not_before - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self.router = LeastBusy(replica_groups(self.targets))
        if reading is not None and reading.processes > 0:
            if self.processes is None:
                self.processes = CollectProcesses(reading, self._connector_limits)
                await self.processes.start()
            post_run = self.processes.post_run(self.router)
        else:
            if self._session is None:
                self._session = client_session(self._connector_limits)
            post_run = make_post_run(self._session, self.router)
        timeouts = self._timeouts
        watch = PolicyWatch(self.policy.base_urls, timeouts.policy_health_timeout_s, timeouts.policy_health_failures)
        judges = PolicyWatch(
            self.judge_urls, timeouts.policy_health_timeout_s, timeouts.policy_health_failures, role="judge server"
        )

        async def health() -> None:
            await self._check_gym()
            # Gym's model servers retry a server that does not answer forever: watch the policy's and the judge's.
            await asyncio.gather(watch.check(), judges.check())

        return await run_examples_in_order(
            examples,
            post_run=post_run,
            deadline_s=deadline_s,
            health_check=health,
            health_check_interval_s=health_check_interval_s,
            progress=ProgressLine(
                waiting_on=lambda: watch.waiting_on() or judges.waiting_on(), finished=self.router.spread
            ),
            retries=retries,
            retry_delay_s=retry_delay_s,
            attempts=attempts,
        )

    def close(self) -> None:
        """No batch after this; the HTTP session and the collect processes are closed on the loop (if it still runs;
        collect processes whose parent's loop is gone see their sockets close and exit). Idempotent."""
        self.closed = True
        session, self._session = self._session, None
        processes, self.processes = self.processes, None
        if (session is None and processes is None) or self.loop.closed:
            return

        async def _close() -> None:
            if session is not None:
                await session.close()
            if processes is not None:
                await processes.close()

        with contextlib.suppress(Exception):
            self.loop.run(_close(), timeout=30.0, what="closing the NeMo Gym HTTP session and collect processes")
