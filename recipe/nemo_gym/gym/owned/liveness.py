# SPDX-License-Identifier: Apache-2.0
"""Liveness of the NeMo Gym the plugin started, by process (HTTP only on request).

Contract:
- `server_health(servers, tree, http_timeout_s)` is cheap (process liveness of each server Gym reported and of
  its launcher; HTTP only with a timeout) and names each dead server and why, the launcher included.
- `check_server_health(report, tail)` raises `GymServerDied` naming every dead server, with `tail(name)` of the
  first (its log).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from recipe.nemo_gym.gym.errors import GymServerDied
from recipe.nemo_gym.gym.over_http.client import ServerInstance
from recipe.nemo_gym.gym.over_http.health import http_alive
from recipe.nemo_gym.gym.owned.processes import ProcessTree, exit_description


@dataclass(frozen=True)
class ServerHealth:
    name: str
    alive: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    servers: tuple[ServerHealth, ...]

    @property
    def dead(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.servers if not s.alive)

    @property
    def ok(self) -> bool:
        return not self.dead


LAUNCHER = "launcher"
"""The name a health report gives NeMo Gym's launcher process (it runs the head server)."""


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def server_health(
    servers: Sequence[ServerInstance], tree: ProcessTree | None, http_timeout_s: float | None = None
) -> HealthReport:
    """Process liveness of every server and of the launcher (and, with `http_timeout_s`, whether each server
    answers HTTP). A server's process is the one Gym reported for it (`ServerInstance.pid`)."""
    report = []
    for server in servers:
        if server.pid is not None and not pid_alive(server.pid):
            report.append(ServerHealth(server.name, False, f"process {server.pid} is gone"))
        elif http_timeout_s is not None and server.host and not http_alive(server.host, server.port, http_timeout_s):
            report.append(ServerHealth(server.name, False, f"no HTTP answer at {server.url}"))
        else:
            report.append(ServerHealth(server.name, True, "running"))
    if tree is not None:
        code = tree.launcher_exit_code()
        if code is not None:
            report.append(ServerHealth(LAUNCHER, False, f"NeMo Gym's launcher {exit_description(code)}"))
    return HealthReport(tuple(report))


def check_server_health(report: HealthReport, tail: Callable[[str], str] = lambda name: "") -> None:
    """Raise `GymServerDied` naming every dead server of `report`, then `tail(name)` of the first (its log)."""
    if report.ok:
        return
    lines = [f"NeMo Gym server {s.name!r}: {s.detail}." for s in report.servers if not s.alive]
    raise GymServerDied("\n".join(lines) + tail(report.dead[0]), report.dead)
