# SPDX-License-Identifier: Apache-2.0
"""What the plugin needs from a running NeMo Gym, over HTTP only: no `nemo_gym` import, any Gym from 0.4 to 0.7.

Contract:
- `HeadClient(host, port)` reads the head server (blocking, each call bounded by its timeout):
  `instances()` from `GET /server_instances` (every server's name, type, URL and the pid of its process),
  `config()` from `GET /global_config_dict_yaml` (the whole parsed configuration, a YAML string sent as JSON).
  Network faults raise `OSError`.
- `ServerInstance` is one server the head server lists. `instances_from_json` and `run_targets` are pure.
  `run_targets(config, instances)` maps each agent to the URL its rows are posted to: the one environment server
  in front of it where the configuration has one (Gym 0.7 generates a `legacy_agent` relay for every agent a
  config leaves without one), else the agent itself (0.4). Rows go where Gym's own collector would send them.
- `post_row` posts one row (with the row indices Gym's collector would add) to its target's `/run` on an aiohttp session
  the caller owns (`make_post_run` binds it to a session and a router) and returns the agent's result or the row's
  `EpisodeFailure` (`outcomes.py` decides the cause): an HTTP error status, a body that is not a JSON object, a failure
  Gym reported on an HTTP 200 row, a prompt refused as too long. A connection that cannot be made is retried
  `CONNECT_RETRIES` times (nothing was sent), then the row fails; a connection dropped mid-request fails the row at
  once, as a SERVER_ERROR. Whether such a row is run again is decided above this, for every infrastructure cause alike
  (`failures.retries`, `collect.run_examples_in_order`): a second run is a new episode, never a resumed one, and only
  the last run's result is trained on. The batch's deadline and health checks (`collect.py`) bound the rest.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym.gym.over_http.limits import LIMIT_KEY, LIMIT_PER_HOST_KEY
from recipe.nemo_gym.gym.over_http.outcomes import (
    context_overflow_failure,
    missing_verdict_failure,
    reported_failure,
    server_error_failure,
)
from recipe.nemo_gym.gym.replicas import LeastBusy

AGENT_SERVER_TYPE = "responses_api_agents"
ENVIRONMENT_SERVER_TYPE = "environment_servers"
# The row indices Gym's own collector stamps on each row before `/run` (0.7.0 `global_config.py`); 0.7's
# environment servers that run the episode themselves (`single_agent_turn_legacy`) require them. A row's batch
# index is its task index here: each row of verl's batch is posted once.
TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
CONNECT_RETRIES = 3
CONNECT_RETRY_DELAY_S = 0.5


def server_root(base_url: str) -> str:
    """`http://host:port` of an OpenAI base URL (`http://host:port/v1`): where vLLM serves `/health` and `/metrics`."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


# ----------------------------------------------------------------------------------------- pure parsing


@dataclass(frozen=True)
class ServerInstance:
    """One server of a running NeMo Gym, as its head server lists it: `name` is its top-level config key (e.g.
    `policy_model`)."""

    name: str
    server_type: str
    implementation: str
    host: str | None
    port: int | None
    pid: int | None = None
    """The process Gym started it as (its wrapper shell), from the head server's `/server_instances`."""

    @property
    def server_dir(self) -> tuple[str, str]:
        """`(<type>, <implementation>)`: the folder NeMo Gym runs it from and keys its venv by."""
        return (self.server_type, self.implementation)

    @property
    def url(self) -> str | None:
        return f"http://{self.host}:{self.port}" if self.host and self.port else None


def instances_from_json(items: Iterable[Mapping[str, Any]]) -> list[ServerInstance]:
    """`GET /server_instances` as typed records (the same fields in 0.4.0 and 0.7.0)."""
    servers = []
    for item in items:
        port = item.get("port")
        servers.append(
            ServerInstance(
                name=str(item["process_name"]),
                server_type=str(item["server_type"]),
                implementation=str(item["name"]),
                host=item.get("host"),
                port=int(port) if port else None,
                pid=item.get("pid"),
            )
        )
    return servers


@dataclass(frozen=True)
class RunTarget:
    """Where the rows of one agent are posted: `url` + `/run`; `via` names an environment server in front."""

    agent: str
    url: str
    via: str | None = None


def run_targets(config: Mapping[str, Any], instances: Iterable[ServerInstance]) -> dict[str, RunTarget]:
    """Each agent's `RunTarget` (pure). An agent fronted by several environment servers is an error naming them:
    a row that names only its agent cannot choose between them (Gym 0.7's own collector refuses it too)."""
    by_name = {s.name: s for s in instances}
    fronts: dict[str, list[str]] = {}
    for name, value in config.items():
        inner = value.get(ENVIRONMENT_SERVER_TYPE) if isinstance(value, Mapping) else None
        if not isinstance(inner, Mapping):
            continue
        for server_config in inner.values():
            ref = server_config.get("agent_server") if isinstance(server_config, Mapping) else None
            if isinstance(ref, Mapping) and ref.get("name"):
                fronts.setdefault(str(ref["name"]), []).append(str(name))
    targets = {}
    for server in by_name.values():
        if server.server_type != AGENT_SERVER_TYPE:
            continue
        environment_servers = fronts.get(server.name, [])
        if len(environment_servers) > 1:
            raise ValueError(
                f"agent {server.name!r} is fronted by several environment servers {sorted(environment_servers)}: "
                "rows that name only their agent cannot choose one; keep one per agent"
            )
        front = by_name.get(environment_servers[0]) if environment_servers else None
        if front is not None and front.url:
            targets[server.name] = RunTarget(server.name, front.url, via=front.name)
        elif server.url:
            targets[server.name] = RunTarget(server.name, server.url)
    return targets


def pairing_problems(config: Mapping[str, Any]) -> list[str]:
    """Agents whose resources server declares `allowed_agents` without the agent's type (pure; empty if none).

    The check Gym 0.6+'s collector makes client side before it dispatches rows (`_validate_agent_pairings`,
    0.7.0), which the plugin, importing no Gym code, makes itself once the configuration is known. Waived, as in
    Gym, by `allow_unsupported_pairing: true` in the configuration. Gym's per-row variant (a row's own
    `task_source`) does not apply: rows name their agent.
    """
    if config.get("allow_unsupported_pairing"):
        return []
    problems = []
    for name, value in config.items():
        agents = value.get(AGENT_SERVER_TYPE) if isinstance(value, Mapping) else None
        if not isinstance(agents, Mapping) or len(agents) != 1:
            continue
        agent_type, agent_config = next(iter(agents.items()))
        reference = agent_config.get("resources_server") if isinstance(agent_config, Mapping) else None
        bound = reference.get("name") if isinstance(reference, Mapping) else None
        servers = config.get(bound, {}).get("resources_servers") if isinstance(config.get(bound), Mapping) else None
        if not isinstance(servers, Mapping) or len(servers) != 1:
            continue
        declared = next(iter(servers.values())).get("allowed_agents")
        allowed = [declared] if isinstance(declared, str) else list(declared or [])
        if allowed and agent_type not in allowed:
            problems.append(
                f"agent {name!r} runs {agent_type!r}, but its resources server {bound!r} accepts only: "
                f"{', '.join(allowed)}"
            )
    return problems


# ----------------------------------------------------------------------------------------- head server


def get_json(host: str, port: int, path: str, timeout_s: float) -> tuple[int, Any]:
    """`GET http://host:port/path`: the status and the JSON body (None if the body is not JSON)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
    except http.client.HTTPException as e:
        raise OSError(f"GET http://{host}:{port}{path}: {e!r}") from e
    finally:
        conn.close()
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, None


class HeadClient:
    """The head server of one running NeMo Gym."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0):
        self.host = host
        self.port = port
        self.timeout_s = timeout_s

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _get(self, path: str) -> Any:
        status, body = get_json(self.host, self.port, path, self.timeout_s)
        if status != 200:
            raise OSError(f"GET {self.url}{path} answered HTTP {status}")
        return body

    def instances(self) -> list[ServerInstance]:
        return instances_from_json(self._get("/server_instances") or [])

    def config(self) -> dict[str, Any]:
        text = self._get("/global_config_dict_yaml")
        config = yaml.safe_load(text) if isinstance(text, str) else None
        if not isinstance(config, dict):
            raise OSError(f"GET {self.url}/global_config_dict_yaml did not return a YAML mapping")
        return config


# ----------------------------------------------------------------------------------------- rows


def client_session(overrides: Mapping[str, Any]) -> Any:
    """The aiohttp session rows are posted on, its connection limits those handed to Gym's own clients (the limit
    keys of Gym's global config in `overrides`; aiohttp's defaults where they are absent)."""
    import aiohttp

    connector = aiohttp.TCPConnector(
        limit=int(overrides.get(LIMIT_KEY, 100)), limit_per_host=int(overrides.get(LIMIT_PER_HOST_KEY, 0))
    )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


def make_post_run(session: Any, router: LeastBusy[RunTarget]) -> Callable[[int, Mapping[str, Any]], Any]:
    """`post_run(index, row)` for `collect.run_examples_in_order`, on `session` (an `aiohttp.ClientSession`): each
    row goes to the copy of its agent `router` picks (`replicas.py`; an agent without copies is its one target)."""

    async def post_run(index: int, row: Mapping[str, Any]) -> dict[str, Any] | EpisodeFailure:
        agent = row["agent_ref"]["name"]
        with router.route(agent) as target:
            return await post_row(session, target, agent, index, row)

    return post_run


async def post_row(
    session: Any, target: RunTarget, agent: str, index: int, row: Mapping[str, Any]
) -> dict[str, Any] | EpisodeFailure:
    """Post batch row `index` (which names `agent`) to `target`'s `/run` on `session`; its result or its failure (see
    the module docstring). The one way a row is posted: in the manager, or in a collect process."""
    import aiohttp

    # Failures name the agent the row names, and the server that answered: its environment server, or its copy.
    via = target.via or (target.agent if target.agent != agent else None)
    body = {TASK_INDEX_KEY: index, ROLLOUT_INDEX_KEY: 0, **row}
    for attempt in range(CONNECT_RETRIES + 1):
        try:
            async with session.post(f"{target.url}/run", json=body) as response:
                status = response.status
                body = await response.read()
            break
        except aiohttp.ClientConnectorError as e:  # nothing was sent: safe to try again
            if attempt == CONNECT_RETRIES:
                return server_error_failure(index, agent, None, repr(e), via=via)
            await asyncio.sleep(CONNECT_RETRY_DELAY_S)
        except aiohttp.ClientError as e:
            return server_error_failure(index, agent, None, repr(e), via=via)
    if status >= 400:
        return server_error_failure(index, agent, status, body, via=via)
    try:
        result = json.loads(body)
    except ValueError:
        result = None
    if not isinstance(result, dict):
        return server_error_failure(index, agent, status, f"result is not a JSON object: {body[:300]!r}", via=via)
    server = via or agent
    return (
        reported_failure(index, server, result)
        or context_overflow_failure(index, result)
        or missing_verdict_failure(index, server, result)
        or result
    )
