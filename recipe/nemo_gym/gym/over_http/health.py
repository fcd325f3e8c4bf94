# SPDX-License-Identifier: Apache-2.0
"""Liveness over HTTP: of a running NeMo Gym's servers, whoever started them, and of verl's policy servers.

Contract:
- `wait_until_answering(head, deadline, ...)` polls a head server until every server it lists answers HTTP.
- `FailureStreaks` counts consecutive failed probes per server; any answer resets a count. Two watches use it,
  each for one batch: `RemoteServerWatch` (Gym's servers, `GET /`; an attached Gym, whose processes run
  elsewhere) raises `GymServerDied`, and `PolicyWatch` (verl's servers, or a judge's outside Gym) raises
  `PolicyServerUnreachable`, once a server has failed `limit` probes in a row. Process liveness of a Gym the
  plugin started is `owned/liveness.py`.
- A policy server is alive when it answers `GET <root>/health` with any HTTP status within the probe's timeout
  (`probe_policy_server`, which never raises for a network fault). What makes NeMo Gym 0.4.0 hang is a policy
  server that does not answer at all: its model server retries connection errors every 0.5 s forever. An
  answering server's errors reach the rows as HTTP errors instead. The policy servers are not NeMo Gym
  processes (verl runs them), so they are probed over HTTP, not by process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from recipe.nemo_gym.gym.errors import GymServerDied, PolicyServerUnreachable
from recipe.nemo_gym.gym.over_http.client import HeadClient, ServerInstance, get_json, server_root


def http_alive(host: str, port: int, timeout_s: float) -> bool:
    """NeMo Gym's readiness criterion: the server answers a GET / with any HTTP response."""
    try:
        get_json(host, port, "/", timeout_s)
    except OSError:
        return False
    return True


def wait_until_answering(
    head: HeadClient, deadline: float, poll_s: float, between: Callable[[list[ServerInstance]], None]
) -> tuple[list[ServerInstance], list[str]]:
    """Poll Gym's head server until it lists its servers and every one answers HTTP (ready, in 0.4.0 and 0.7.0;
    0.7's own `/health` also waits for checks the plugin does not need). Returns (the servers, []) then, or at
    `deadline` (the servers last listed, the names of those not answering) for the caller to raise in its own words.
    `between(servers)` runs after each round that is not ready, before the deadline is checked: a check of the
    caller's own (did a process it started die?), which may raise."""
    while True:
        servers: list[ServerInstance] = []
        with contextlib.suppress(OSError):
            servers = head.instances()
            if servers and all(s.host and http_alive(s.host, s.port, 2.0) for s in servers):
                return servers, []
        between(servers)
        if time.monotonic() > deadline:
            return servers, [s.name for s in servers if not (s.host and http_alive(s.host, s.port, 1.0))]
        time.sleep(poll_s)


# --------------------------------------------------------------------------------------- policy servers


def policy_health_url(base_url: str) -> str:
    """vLLM's health endpoint for a policy server's OpenAI base URL: `<root>/health`, `<root>` without `/v1`."""
    return f"{server_root(base_url)}/health"


@dataclass(frozen=True)
class ProbeResult:
    """One health probe of one policy server. `alive` means it answered HTTP at all (any status)."""

    base_url: str
    alive: bool
    detail: str


async def probe_http(url: str, timeout_s: float) -> tuple[bool, str]:
    """`GET url` once, bounded by `timeout_s`: (answered HTTP at all, what happened). Never raises for a network
    fault; reports it."""
    import aiohttp

    # A session of its own (not the one rows are posted on, whose connection pool the batch may be filling).
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url) as response:
                return True, f"HTTP {response.status}"
    except TimeoutError:
        return False, f"no answer within {timeout_s:g}s"
    except aiohttp.ClientConnectorError as e:
        errno = getattr(e.os_error, "errno", None)
        reason = os.strerror(errno) if errno else str(e)
        return False, f"cannot connect ({reason})"
    except aiohttp.ServerDisconnectedError:
        return False, "connection closed without an answer"
    except (aiohttp.ClientError, OSError) as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        await session.close()


async def probe_policy_server(base_url: str, timeout_s: float) -> ProbeResult:
    """`GET <root>/health` once, bounded by `timeout_s`. Never raises for a network fault; reports it."""
    alive, detail = await probe_http(policy_health_url(base_url), timeout_s)
    return ProbeResult(base_url, alive, detail)


class FailureStreaks:
    """How many health probes in a row each server (a key) has failed, and since when; any answer resets it. The
    one counter behind `PolicyWatch` and the attached Gym's `RemoteServerWatch`."""

    def __init__(self, keys: Iterable[str], limit: int):
        if limit < 1:
            raise ValueError(f"max_failures must be >= 1, got {limit}")
        self.limit = limit
        self.counts: dict[str, int] = dict.fromkeys(keys, 0)
        self._since: dict[str, float] = {}

    def record(self, key: str, alive: bool, now: float) -> None:
        if alive:
            self.counts[key] = 0
            self._since.pop(key, None)
        else:
            self.counts[key] = self.counts.get(key, 0) + 1
            self._since.setdefault(key, now)

    def over_limit(self) -> list[str]:
        """The keys that failed `limit` probes in a row, in the order they were first given."""
        return [key for key, count in self.counts.items() if count >= self.limit]

    def failing_for(self, key: str, now: float) -> float:
        return now - self._since.get(key, now)


class RemoteServerWatch:
    """Consecutive unanswered `GET /` probes per Gym server, for one batch (`FailureStreaks`); `max_failures` in a
    row raise `GymServerDied` naming the server, its URL and the last reason. An answer resets the count."""

    def __init__(self, servers: Sequence[ServerInstance], timeout_s: float, max_failures: int):
        self.servers = [s for s in servers if s.url]
        self.timeout_s = timeout_s
        self.streaks = FailureStreaks([s.name for s in self.servers], max_failures)

    @property
    def failures(self) -> dict[str, int]:
        return self.streaks.counts

    def record(self, results: Sequence[tuple[ServerInstance, bool, str]]) -> None:
        last = {server.name: (server, detail) for server, _, detail in results}
        for server, alive, _ in results:
            self.streaks.record(server.name, alive, 0.0)
        names = [name for name in self.streaks.over_limit() if name in last]
        if names:
            dead = [
                f"NeMo Gym server {name!r} at {last[name][0].url} did not answer {self.streaks.counts[name]} "
                f"health checks in a row (last: {last[name][1]})"
                for name in names
            ]
            raise GymServerDied("\n".join(dead) + " (the attached Gym runs elsewhere: see its own logs)", names)

    async def check(self) -> None:
        answers = await asyncio.gather(*(probe_http(f"{s.url}/", self.timeout_s) for s in self.servers))
        self.record([(s, alive, detail) for s, (alive, detail) in zip(self.servers, answers, strict=True)])


class PolicyWatch:
    """Counts consecutive failed health probes per policy server, for one batch.

    `record(results, now)` (pure bookkeeping) resets a server's count on any answer and raises
    `PolicyServerUnreachable` once some server has failed `max_failures` probes in a row, naming each such server,
    its health URL, how long it has been failing and the last reason. `check()` probes every server concurrently
    (each bounded by `timeout_s`) and records the results. A slow server that still answers within `timeout_s`
    never counts; one probe lost to a hiccup is forgiven by the next answer.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        timeout_s: float,
        max_failures: int,
        probe: Callable[[str, float], Any] = probe_policy_server,
        clock: Callable[[], float] = time.monotonic,
        role: str = "policy server",
    ):
        self.base_urls = tuple(base_urls)
        self.role = role  # what the servers are, in messages: verl's policy servers, or the judge's
        self.timeout_s = timeout_s
        self._probe = probe
        self._clock = clock
        self.streaks = FailureStreaks(self.base_urls, max_failures)
        self.probes = 0

    @property
    def failures(self) -> dict[str, int]:
        return self.streaks.counts

    def record(self, results: Sequence[ProbeResult], now: float) -> None:
        self.probes += 1
        last = {r.base_url: r for r in results}
        for result in results:
            self.streaks.record(result.base_url, result.alive, now)
        dead = [last[url] for url in self.streaks.over_limit() if url in last]
        if dead:
            lines = [
                f"{self.role} {r.base_url} did not answer GET {policy_health_url(r.base_url)} "
                f"{self.failures[r.base_url]} times in a row over {self.streaks.failing_for(r.base_url, now):.1f}s "
                f"(last: {r.detail})"
                for r in dead
            ]
            raise PolicyServerUnreachable("\n".join(lines), [r.base_url for r in dead], self.role)

    async def check(self) -> None:
        results = await asyncio.gather(*(self._probe(url, self.timeout_s) for url in self.base_urls))
        self.record(results, self._clock())

    def waiting_on(self) -> str | None:
        """What the batch is waiting on while some policy server fails its probes (for the progress line), or None."""
        failing = [f"{url} ({n} of {self.streaks.limit} probes unanswered)" for url, n in self.failures.items() if n]
        return f"{self.role} {', '.join(failing)} not answering" if failing else None
