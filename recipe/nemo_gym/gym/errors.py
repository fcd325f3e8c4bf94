# SPDX-License-Identifier: Apache-2.0
"""The errors of NeMo Gym's servers under the plugin, in the plugin's families (`recipe/nemo_gym/errors.py`).

`GymConfigError` (a `ConfigError`) means nothing was started. The others are `ServerError`s and name the servers
concerned in `servers`: NeMo Gym server names, or for `PolicyServerUnreachable` the policy's base URLs (verl's
vLLM servers, which are not NeMo Gym's). Episode failures and aborted batches are not here: they are
`recipe.nemo_gym.failures.EpisodeFailure` and `RolloutAborted`.
"""

from __future__ import annotations

from collections.abc import Sequence

from recipe.nemo_gym.errors import ConfigError, ServerError


class GymConfigError(ConfigError):
    """The spec or a NeMo Gym config it names is wrong; nothing was started."""


class HeadPortInUseError(ServerError):
    """The head server's port is taken by another process; nothing was started."""


class GymServerDied(ServerError):
    """One or more NeMo Gym server processes exited, or NeMo Gym was shut down. `servers` names them."""


class PolicyServerUnreachable(ServerError):
    """Model servers outside Gym that stopped answering HTTP: verl's policy (vLLM) servers, or the judge's servers
    (`role`). `servers` holds their base URLs."""

    def __init__(self, message: str, servers: Sequence[str] = (), role: str = "policy server"):
        super().__init__(message, servers)
        self.role = role


class GymStartTimeout(ServerError, TimeoutError):
    """Servers did not all answer HTTP before the start-up deadline. `servers` names those that did not."""
