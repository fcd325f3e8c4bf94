# SPDX-License-Identifier: Apache-2.0
"""`connect_gym`: the one way the manager gets a NeMo Gym, from the validated environments file and verl's policy
servers.

Contract:
- Without `nemo_gym.attach`, the plugin starts Gym and owns its process tree (`owned/launch.py`, `OwnedGym`);
  with it, the plugin uses a Gym someone else started and owns nothing of it (`attach.py`, `AttachedGym`).
- Either way the caller gets a `Gym` whose `connection` (`over_http.connection.GymConnection`: the servers, the
  agents rows may name, `collect`, which checks a batch's rows once and runs them) exists, with `version`,
  `startup_s`, and `shutdown()`, which the caller owes it (the exit hooks call it too, `exit_hooks.py`).
- The HTTP connection limits are derived here from this process's file limit (`limits.py`) and logged; `node_ip`
  gives the address an attached Gym reaches this trainer's policy relay at, asked only when the file does not say.
- What the caller hands in besides the config are the values of `types.py`: `PolicyServers`, and the
  `CollectSettings` its batches are read with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.attach import AttachedGym
from recipe.nemo_gym.gym.over_http.connection import GymConnection
from recipe.nemo_gym.gym.over_http.limits import ConnectionLimits, current_nofile_limits, derive_connection_limits
from recipe.nemo_gym.gym.owned.launch import OwnedGym
from recipe.nemo_gym.gym.types import PolicyServers

logger = logging.getLogger(__name__)


class Gym(Protocol):
    """A connected NeMo Gym, started (`OwnedGym`) or attached (`AttachedGym`)."""

    connection: GymConnection
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
    node_ip: Callable[[], str] | None = None,
    limits: ConnectionLimits | None = None,
) -> Gym:
    """Start or attach to the NeMo Gym `config` describes, connected to `policy`; rows run on `loop` (borrowed).
    `limits`: the HTTP connection limits, when not this process's (`limits.derive_connection_limits`)."""
    if limits is None:
        limits = derive_connection_limits(*current_nofile_limits())
        log = logger.warning if limits.below_floor else logger.info
        log("NeMo Gym HTTP connection limits: %s", limits.describe())  # the user's nemo_gym.config_overrides win
    attach = config.nemo_gym.attach
    if attach is None:
        return OwnedGym.start(config, policy, loop=loop, limits=limits)
    # A relay runs only in front of several policy servers; the node's address is asked for only then.
    needs_address = attach.relay_host is None and len(policy.base_urls) > 1 and node_ip is not None
    relay_host = node_ip() if needs_address else "127.0.0.1"
    return AttachedGym.attach(config, policy, loop=loop, relay_host=relay_host, limits=limits)
