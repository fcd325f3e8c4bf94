# SPDX-License-Identifier: Apache-2.0
"""`connect_gym`: the one way the manager gets a NeMo Gym, from the validated environments file and verl's policy
servers.

Contract:
- Without `nemo_gym.attach`, the plugin starts Gym and owns its process tree (`owned/launch.py`, `OwnedGym`);
  with it, the plugin uses a Gym someone else started and owns nothing of it (`attach.py`, `AttachedGym`).
- Either way the caller gets a `Gym`: `connection` (`over_http.connection.GymConnection`: the servers, the agents
  rows may name, `collect`), `version`, `startup_s`, and `shutdown()`, which the caller owes it (the exit hooks
  call it too, `exit_hooks.py`).
- `limits` are the HTTP connection limits derived from this process's file limit (`limits.py`); `node_ip` gives
  the address an attached Gym reaches this trainer's policy relay at, asked only when the YAML does not say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.attach import AttachedGym
from recipe.nemo_gym.gym.over_http.connection import GymConnection, PolicyServers
from recipe.nemo_gym.gym.owned.launch import OwnedGym
from recipe.nemo_gym.limits import ConnectionLimits


class Gym(Protocol):
    """A connected NeMo Gym, started (`OwnedGym`) or attached (`AttachedGym`)."""

    connection: GymConnection | None  # set once started or attached; `connect_gym` returns no Gym without it
    startup_s: float | None

    @property
    def version(self) -> str | None: ...

    def shutdown(self) -> None: ...

    def kill_now(self) -> None: ...


def connect_gym(
    config: NeMoGymConfig,
    policy: PolicyServers,
    *,
    loop: BackgroundLoop,
    limits: ConnectionLimits | None = None,
    node_ip: Callable[[], str] | None = None,
) -> Gym:
    """Start or attach to the NeMo Gym `config` describes, connected to `policy`; rows run on `loop` (borrowed)."""
    attach = config.nemo_gym.attach
    if attach is None:
        return OwnedGym.start(config, policy, loop=loop, limits=limits)
    # A relay runs only in front of several policy servers; the node's address is asked for only then.
    needs_address = attach.relay_host is None and len(policy.base_urls) > 1 and node_ip is not None
    relay_host = node_ip() if needs_address else "127.0.0.1"
    return AttachedGym.attach(config, policy, loop=loop, relay_host=relay_host, limits=limits)
