# SPDX-License-Identifier: Apache-2.0
"""Agent replicas: `nemo_gym.replicas: {<agent>: K}` runs K copies of an agent, and the rows that name the agent are
spread over them, fewest episodes in flight first.

Why: a NeMo Gym agent is one process (Gym 0.7.0's `simple_agent` cannot run as several uvicorn workers), and at
about 5.7 ms of a core per model call it caps a step near 175 calls/s however many cores the node has.

Contract (pure: no HTTP, no Gym import):
- Copy r (2..K) of the server named `S` is `S__replica<r>` (`replica_name`); the original is copy 1. Rows, data
  files and metrics name the agent only: the copies exist inside the Gym stack and nowhere else.
- `replica_overrides(replicas, config)` reads Gym's configuration as its files declare it (`config`: the config
  files and the plugin's overrides merged, before Gym composes them) and returns the top-level keys that declare the
  copies with Gym's own `_copy` key (0.4.0 and 0.7.0). Each copy of an agent gets its own copy of the agent's
  resources server: an episode's seed, tool calls and verify all go to the resources server of the agent copy that
  runs it, so per-session state stays in one process, and the verify, the next single process on an episode's
  path, is spread too. An environment server the files put in front of the agent is copied and pointed at the agent
  copy; an agent with none gets Gym 0.7's generated `legacy_agent` relay, and so does each copy. An agent the files
  do not declare as one `responses_api_agents` block is a `ValueError` naming it.
- `replica_groups(targets)` maps each agent to its copies' values, the agent first, then copy 2, 3, ...; a copy
  whose agent is not in `targets` stays an agent of its own. It is applied to whatever Gym the plugin talks to, so an
  attached Gym whose owner declared copies under these names is used the same way.
- `LeastBusy` picks, per row, the copy with the fewest rows in flight (`pick_server`; ties rotate), and says how
  the rows were spread (`spread`: the batch's last progress line).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

AGENTS = "responses_api_agents"
RESOURCES_SERVERS = "resources_servers"
ENVIRONMENT_SERVERS = "environment_servers"
COPY_KEY = "_copy"  # Gym's directive: this top-level value is a copy of the one named, merged with what is given
_COPY = re.compile(r"^(?P<agent>.+)__replica(?P<r>[2-9]|[1-9]\d+)$")


def replica_name(name: str, r: int) -> str:
    """The name of copy `r` (2 or more) of the server `name`."""
    if r < 2:
        raise ValueError(f"copy numbers start at 2 (the server itself is copy 1), got {r}")
    return f"{name}__replica{r}"


def replica_of(name: str) -> str | None:
    """The server `name` is a copy of, or None when it is not named as a copy."""
    match = _COPY.match(name)
    return match["agent"] if match else None


def _single_block(value: Any, server_type: str) -> tuple[str, Mapping[str, Any]] | None:
    """`(<implementation>, <its config>)` of a top-level value declaring one server of `server_type`, else None."""
    inner = value.get(server_type) if isinstance(value, Mapping) else None
    if not isinstance(inner, Mapping) or len(inner) != 1:
        return None
    implementation, block = next(iter(inner.items()))
    return (str(implementation), block) if isinstance(block, Mapping) else None


def replica_overrides(replicas: Mapping[str, int], config: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level Gym config keys that declare every copy of `replicas` (see the module docstring)."""
    overrides: dict[str, Any] = {}
    for agent, count in replicas.items():
        declared = _single_block(config.get(agent), AGENTS)
        if declared is None:
            raise ValueError(
                f"nemo_gym.replicas.{agent}: no agent {agent!r} is declared in the configuration's files as one "
                f"{AGENTS} block (declared agents: {sorted(n for n, v in config.items() if _single_block(v, AGENTS))})"
            )
        agent_type, agent_block = declared
        reference = agent_block.get("resources_server")
        resources = reference.get("name") if isinstance(reference, Mapping) else None
        fronts = [
            (name, *front)
            for name, value in config.items()
            if (front := _single_block(value, ENVIRONMENT_SERVERS)) is not None
            and isinstance(front[1].get("agent_server"), Mapping)
            and front[1]["agent_server"].get("name") == agent
        ]
        for r in range(2, count + 1):
            agent_copy: dict[str, Any] = {COPY_KEY: agent}
            if resources:
                overrides[replica_name(resources, r)] = {COPY_KEY: resources}
                agent_copy[AGENTS] = {agent_type: {"resources_server": {"name": replica_name(resources, r)}}}
            overrides[replica_name(agent, r)] = agent_copy
            for front_name, front_type, _ in fronts:
                overrides[replica_name(front_name, r)] = {
                    COPY_KEY: front_name,
                    ENVIRONMENT_SERVERS: {front_type: {"agent_server": {"name": replica_name(agent, r)}}},
                }
    return overrides


def replica_groups[T](targets: Mapping[str, T]) -> dict[str, tuple[T, ...]]:
    """Each agent of `targets` (keyed by server name) with its copies' values: the agent first, copies by number."""
    copies: dict[str, list[tuple[int, T]]] = {}
    groups: dict[str, tuple[T, ...]] = {}
    for name, value in targets.items():
        match = _COPY.match(name)
        if match and match["agent"] in targets:
            copies.setdefault(match["agent"], []).append((int(match["r"]), value))
    for name, value in targets.items():
        base = replica_of(name)
        if base is None or base not in targets:
            groups[name] = (value, *(v for _, v in sorted(copies.get(name, []), key=lambda c: c[0])))
    return groups


def pick_server(in_flight: Sequence[int], start: int) -> int:
    """The index of the server with the fewest requests in flight, scanning from `start` (so ties rotate)."""
    n = len(in_flight)
    best = start % n
    for step in range(1, n):
        i = (start + step) % n
        if in_flight[i] < in_flight[best]:
            best = i
    return best


class LeastBusy[T]:
    """Chooses among each agent's copies: `with router.route(agent) as target:` holds one row in flight there."""

    def __init__(self, groups: Mapping[str, Sequence[T]]):
        self.groups = {agent: tuple(copies) for agent, copies in groups.items()}
        self.in_flight = {agent: [0] * len(copies) for agent, copies in self.groups.items()}
        self.routed = {agent: [0] * len(copies) for agent, copies in self.groups.items()}
        self._next = dict.fromkeys(self.groups, 0)

    @contextmanager
    def route(self, agent: str) -> Iterator[T]:
        counts = self.in_flight[agent]
        i = pick_server(counts, self._next[agent])
        self._next[agent] = (i + 1) % len(counts)
        counts[i] += 1
        self.routed[agent][i] += 1
        try:
            yield self.groups[agent][i]
        finally:
            counts[i] -= 1

    def spread(self) -> str | None:
        """How many rows each copy was given, for the agents with copies that ran any, e.g.
        "math_simple_agent on 2 copies: 5, 4 runs" (a retried row counts once per run); None if there are none."""
        parts = [
            f"{agent} on {len(counts)} copies: {', '.join(map(str, counts))} runs"
            for agent, counts in self.routed.items()
            if len(counts) > 1 and any(counts)
        ]
        return "; ".join(parts) or None
