# SPDX-License-Identifier: Apache-2.0
"""`GymConnection`: what a running NeMo Gym gives the manager, whoever started it: its servers, where each agent's
rows go, and `collect`, which runs a batch over HTTP.

Contract:
- Two kinds build on it: `launch.GymRuntime` (the plugin started Gym and owns its processes) and
  `attach.AttachedGym` (someone else started it; the plugin owns nothing of it). Each supplies `_check_gym()`,
  the health check of Gym's servers made while a batch waits, and its own `shutdown()` and `kill_now()`, which
  begin with `_claim_stop()` (only the first of them acts) and end with `_forget()` (out of `processes.LIVE`).
- `_adopt(config, servers)` takes the head server's configuration and server list and sets `servers` and
  `targets` (`client.run_targets`), refusing a configuration whose rows could not be run or scored
  (`GymConfigError`: several environment servers in front of one agent, an agent its resources server does not
  accept).
- `loop` is the caller's `BackgroundLoop`, borrowed: the aiohttp session rows are posted on is made on it at the
  first `collect`, every `collect` must be awaited on it (anything else raises `RuntimeError` before a request
  goes out), and `_close_session()` closes the session there (skipped once the loop is closed).
- While a batch waits, `collect` checks Gym's servers (`_check_gym`) and verl's policy servers
  (`health.PolicyWatch`: `policy_health_failures` consecutive probes without an answer abort the batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import RolloutAborted
from recipe.nemo_gym.gym.client import RunTarget, make_post_run, pairing_problems, run_targets
from recipe.nemo_gym.gym.collect import ProgressLine, RowOutcome, run_examples_in_order, validate_examples
from recipe.nemo_gym.gym.errors import GymConfigError
from recipe.nemo_gym.gym.health import PolicyWatch
from recipe.nemo_gym.gym.processes import LIVE, LIVE_LOCK
from recipe.nemo_gym.gym.spec import AGENT_SERVER_TYPE, ServerInstance


class GymConnection:
    """A running NeMo Gym seen over HTTP. Subclasses start or attach to it; see the module docstring."""

    def __init__(
        self,
        loop: BackgroundLoop,
        *,
        overrides: Mapping[str, Any],
        policy_base_urls: Sequence[str],
        policy_health_timeout_s: float,
        policy_health_failures: int,
    ):
        self.loop = loop  # borrowed: the caller created it and closes it, after `shutdown()`
        self.servers: tuple[ServerInstance, ...] = ()
        self.targets: dict[str, RunTarget] = {}
        self.startup_s: float | None = None
        self._overrides = overrides
        self._policy_base_urls = tuple(policy_base_urls)
        self._policy_health_timeout_s = policy_health_timeout_s
        self._policy_health_failures = policy_health_failures
        self._session: Any = None
        self._stopped = False
        # Re-entrant: `kill_now` runs in a signal handler, which may interrupt this thread inside `shutdown`.
        self._stop_lock = threading.RLock()

    @property
    def version(self) -> str | None:
        """The nemo-gym release running, as far as it can be known."""
        raise NotImplementedError

    def _claim_stop(self) -> bool:
        """True for the one call that stops this connection: `shutdown` or `kill_now`, whichever comes first."""
        with self._stop_lock:
            if self._stopped:
                return False
            self._stopped = True
            return True

    def _forget(self) -> None:
        """Leave `processes.LIVE`: the exit hooks have nothing left to stop here."""
        with LIVE_LOCK:
            LIVE.discard(self)

    @property
    def agent_names(self) -> frozenset[str]:
        """The agent servers rows can name in `agent_ref.name`."""
        return frozenset(s.name for s in self.servers if s.server_type == AGENT_SERVER_TYPE)

    def _adopt(self, config: Mapping[str, Any], servers: Sequence[ServerInstance], what: str) -> None:
        """Take the head server's answer; `what` names the configuration in errors (its files, or its URL)."""
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
        self.servers = tuple(servers)
        self.targets = targets

    async def _check_gym(self) -> None:
        """Raise `GymServerDied` naming Gym's servers that are gone; called every health-check interval."""
        raise NotImplementedError

    async def collect(
        self,
        examples: Sequence[Mapping[str, Any]],
        deadline_s: float,
        health_check_interval_s: float,
        *,
        retries: int = 0,
        retry_delay_s: float = 0.0,
        attempts: list[int] | None = None,
    ) -> list[RowOutcome]:
        """Run every row on its agent; results in input order. Await it on `self.loop` (the caller's loop).

        The times come from the plugin config (`timeouts.batch_s`, `timeouts.health_check_interval_s`), and so do
        the retries of a row that failed for an infrastructure cause (`failures.retries`, `failures.retry_delay_s`;
        `attempts` receives each row's number of runs: see `collect.run_examples_in_order`)."""
        if self._stopped:
            raise RolloutAborted("NeMo Gym is shut down: no batch can run")
        if asyncio.get_running_loop() is not self.loop.loop:
            raise RuntimeError(
                f"{type(self).__name__}.collect must run on the loop it was given ({self.loop.name!r}): its HTTP "
                "session is bound to it; await it there, e.g. `await runtime.loop.arun(...)`"
            )
        validate_examples(examples, self.agent_names)
        if self._session is None:
            self._session = client_session(self._overrides)
        watch = PolicyWatch(self._policy_base_urls, self._policy_health_timeout_s, self._policy_health_failures)

        async def health() -> None:
            await self._check_gym()
            # Gym's model server retries a policy server that does not answer forever: watch those too.
            await watch.check()

        return await run_examples_in_order(
            examples,
            post_run=make_post_run(self._session, self.targets),
            deadline_s=deadline_s,
            health_check=health,
            health_check_interval_s=health_check_interval_s,
            progress=ProgressLine(waiting_on=watch.waiting_on),
            retries=retries,
            retry_delay_s=retry_delay_s,
            attempts=attempts,
        )

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is None or self.loop.closed:
            return

        async def _close() -> None:
            await session.close()

        with contextlib.suppress(Exception):
            self.loop.run(_close(), timeout=5.0, what="closing the NeMo Gym HTTP session")


def client_session(overrides: Mapping[str, Any]) -> Any:
    """The aiohttp session rows are posted on, its connection limits those handed to Gym's own clients."""
    import aiohttp

    from recipe.nemo_gym.limits import LIMIT_KEY, LIMIT_PER_HOST_KEY

    connector = aiohttp.TCPConnector(
        limit=int(overrides.get(LIMIT_KEY, 100)), limit_per_host=int(overrides.get(LIMIT_PER_HOST_KEY, 0))
    )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
