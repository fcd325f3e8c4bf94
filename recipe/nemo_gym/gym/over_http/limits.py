# SPDX-License-Identifier: Apache-2.0
"""HTTP connection limits for NeMo Gym's aiohttp clients, derived from the file-descriptor limit (RLIMIT_NOFILE).

Why: NeMo Gym (0.4 to 0.7) gives each of its servers (which call the model server, the resources server or the
policy) one aiohttp `TCPConnector` sized by two global config keys (`GlobalAIOHTTPAsyncClientConfig` in
`nemo_gym/server_utils.py`): `global_aiohttp_connector_limit` (default 102,400) and
`global_aiohttp_connector_limit_per_host` (1,024); the manager's own session, which posts each episode to its agent
(`client.client_session`), reads the same two keys. Both defaults are far above a common `ulimit -n` (1,024 on many
clusters), so a large batch runs a process out of file descriptors ("Too many open files") instead of queueing in
the connector. With limits that fit, excess requests wait for a free connection, which is the behaviour a long run
needs.

Contract: `derive_connection_limits(soft, hard)` is pure and total over `(soft, hard)` as
`resource.getrlimit(RLIMIT_NOFILE)` returns them (`resource.RLIM_INFINITY` for "unlimited"); it returns
`ConnectionLimits`, whose `merged_under(overrides)` puts the two keys under a NeMo Gym global-config overrides
dict, so keys the user set there win. `current_nofile_limits()` reads this process's limits (the only
function here that looks at the process). No import of Ray, HTTP or vLLM.

The formula (every constant is named below):

1. The processes. One value of each key reaches every process of the configuration (it is a global config
   key), so it must fit the tightest one:
   - the manager (verl's trainer-side process) keeps the `soft` limit it has; its connector only makes client
     connections (to the agents);
   - every NeMo Gym server inherits the manager's limits and raises its own soft limit at start-up
     (`SimpleServer.set_ulimit`, target 65,535): to 65,535 when the hard limit allows it, otherwise the
     attempt fails and the soft limit stays as inherited (`server_soft_limit`).
2. The headroom. Each process needs descriptors that are not HTTP connections: shared libraries, log files,
   pipes, Ray's gRPC channels, the environment's own files and databases. `reserve = max(256, soft // 8)`
   (an idle NeMo Gym server holds about 40 here, the trainer process more); `budget = soft - reserve`.
3. What one in-flight episode holds (measured with `benchmarks/bench_load.py`, socket by socket): NeMo Gym
   0.4.0's `simple_agent` serves `/run` (one socket from the manager), posts to its own `/v1/responses`
   (two sockets: out and in), and calls the model server and the resources server (one each): 5 sockets per
   episode, each leg to one host. aiohttp never holds more connections to one host, idle keep-alive ones
   included, than it once had in use there at the same time, i.e. `per_host`. The model server holds two
   per episode (in, and out to the policy), bounded by the number of episodes in flight, i.e. `total`.
4. The limits.
   - `total = min(budget(soft), budget(server_soft) // 2, 102400)`: the manager's own sockets, the model
     server's two per episode, and never above NeMo Gym's own default.
   - `per_host = min(total, budget(server_soft) // 5, 1024)`: the agent's five sockets per episode.
     NeMo Gym's default of 1,024 per host stays the ceiling: it is NeMo Gym's chosen concurrency towards one
     upstream, and raising it is a throughput decision left to the user (`nemo_gym.config_overrides`).
   - Below `MIN_TOTAL` / `MIN_PER_HOST` (a soft limit under about 300) the floors apply and `below_floor` is
     set: such a limit cannot hold a NeMo Gym configuration, and the manager says so in its log.

Caveats: an agent that calls tools concurrently, or several agents sharing one model server, hold more per
episode than counted here; set the keys in `nemo_gym.config_overrides` for such setups. NeMo Gym divides both
values by a server's own uvicorn worker count (`num_workers`), which only makes each worker stricter; a
quotient of 0 would mean "no limit" to aiohttp, which the floors avoid for up to 8 workers.

Values (checked in tests): soft = hard = 1,024 gives 384 / 153; 20,000 gives 8,750 / 1,024; 65,535 gives
28,672 / 1,024; unlimited gives 28,672 / 1,024 (the servers lower an unlimited soft limit to 65,535).
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# NeMo Gym 0.4.0 global config keys (nemo_gym/server_utils.py `GlobalAIOHTTPAsyncClientConfig`) and defaults.
LIMIT_KEY = "global_aiohttp_connector_limit"
LIMIT_PER_HOST_KEY = "global_aiohttp_connector_limit_per_host"
NEMO_GYM_DEFAULT_LIMIT = 100 * 1024
NEMO_GYM_DEFAULT_LIMIT_PER_HOST = 1024
# NeMo Gym 0.4.0 `SimpleServer.set_ulimit(target_soft_limit=65535)`, called by every server at start-up.
SERVER_SOFT_TARGET = 65535

RESERVE_MIN = 256
RESERVE_DIVISOR = 8
# Sockets per in-flight episode: the simple_agent's 5, the model server's 2 (see the module docstring).
AGENT_SOCKETS_PER_EPISODE = 5
MODEL_SERVER_SOCKETS_PER_EPISODE = 2
MIN_TOTAL = 16
MIN_PER_HOST = 8

UNLIMITED = resource.RLIM_INFINITY


@dataclass(frozen=True)
class ConnectionLimits:
    """Connector limits for NeMo Gym's global config, with the inputs they were derived from."""

    total: int
    per_host: int
    soft: int
    hard: int
    server_soft: int
    below_floor: bool = False

    def as_overrides(self) -> dict[str, int]:
        return {LIMIT_KEY: self.total, LIMIT_PER_HOST_KEY: self.per_host}

    def merged_under(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """`overrides` with the two keys added where the user did not set them (the user's values win)."""
        merged: dict[str, Any] = self.as_overrides()
        merged.update(overrides)
        return merged

    def describe(self) -> str:
        def show(n: int) -> str:
            return "unlimited" if n == UNLIMITED else str(n)

        return (
            f"{LIMIT_KEY}={self.total}, {LIMIT_PER_HOST_KEY}={self.per_host} (RLIMIT_NOFILE soft {show(self.soft)}, "
            f"hard {show(self.hard)}; NeMo Gym servers' soft limit {show(self.server_soft)})"
        )


def _check(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"RLIMIT_NOFILE {name} must be an int, got {value!r}")
    if value < 0 and value != UNLIMITED:
        raise ValueError(f"RLIMIT_NOFILE {name} must be non-negative or resource.RLIM_INFINITY, got {value}")


def server_soft_limit(soft: int, hard: int, target: int = SERVER_SOFT_TARGET) -> int:
    """The soft limit a NeMo Gym server ends with after its `set_ulimit(target)`, given the inherited limits.

    0.4.0 compares `soft < target` (an unlimited soft limit reads as -1 there, so it is "below" too) and calls
    `setrlimit((target, hard))`, which fails (caught, printed) when `target` exceeds a finite hard limit.
    """
    _check("soft", soft)
    _check("hard", hard)
    if soft == UNLIMITED or soft < target:
        if hard == UNLIMITED or hard >= target:
            return target
    return soft


def reserve(soft: int) -> int:
    """Descriptors kept free of HTTP connections in a process with this soft limit (finite)."""
    return max(RESERVE_MIN, soft // RESERVE_DIVISOR)


def _budget(soft: int) -> int | None:
    """Descriptors left for sockets under `soft`; None when unlimited."""
    return None if soft == UNLIMITED else max(0, soft - reserve(soft))


def derive_connection_limits(soft: int, hard: int) -> ConnectionLimits:
    """The connector limits for a manager process with RLIMIT_NOFILE `(soft, hard)` (see the module docstring)."""
    _check("soft", soft)
    _check("hard", hard)
    if soft != UNLIMITED and hard != UNLIMITED and soft > hard:
        raise ValueError(f"RLIMIT_NOFILE soft limit {soft} is above the hard limit {hard}")
    servers_soft = server_soft_limit(soft, hard)
    totals = [NEMO_GYM_DEFAULT_LIMIT]
    per_hosts = [NEMO_GYM_DEFAULT_LIMIT_PER_HOST]
    manager_budget = _budget(soft)
    if manager_budget is not None:
        totals.append(manager_budget)
    server_budget = _budget(servers_soft)
    if server_budget is not None:
        totals.append(server_budget // MODEL_SERVER_SOCKETS_PER_EPISODE)
        per_hosts.append(server_budget // AGENT_SOCKETS_PER_EPISODE)
    total = min(totals)
    per_host = min(total, *per_hosts)
    below_floor = total < MIN_TOTAL or per_host < MIN_PER_HOST
    return ConnectionLimits(
        total=max(total, MIN_TOTAL),
        per_host=max(per_host, MIN_PER_HOST),
        soft=soft,
        hard=hard,
        server_soft=servers_soft,
        below_floor=below_floor,
    )


def current_nofile_limits() -> tuple[int, int]:
    """This process's RLIMIT_NOFILE `(soft, hard)`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft), int(hard)
