# SPDX-License-Identifier: Apache-2.0
"""The errors NeMo Gym's servers raise under the plugin.

Contract: every error is a `GymRuntimeError`. `GymConfigError` means nothing was started; `GymServerDied` and
`GymStartTimeout` name the servers concerned in `servers`. Episode failures and aborted batches are not here:
they are `recipe.nemo_gym.failures.EpisodeFailure` and `RolloutAborted`.
"""

from __future__ import annotations

from collections.abc import Sequence


class GymRuntimeError(RuntimeError):
    """NeMo Gym's servers could not be started, or are not healthy."""


class GymConfigError(GymRuntimeError, ValueError):
    """The spec or a NeMo Gym config it names is wrong; nothing was started."""


class HeadPortInUseError(GymRuntimeError):
    """The head server's port is taken by another process; nothing was started."""


class GymServerDied(GymRuntimeError):
    """One or more NeMo Gym server processes exited. `servers` names them."""

    def __init__(self, message: str, servers: Sequence[str]):
        super().__init__(message)
        self.servers = tuple(servers)


class PolicyServerUnreachable(GymServerDied):
    """Policy (vLLM) servers that stopped answering HTTP. `servers` holds their base URLs."""


class GymStartTimeout(GymRuntimeError, TimeoutError):
    """Servers did not all answer HTTP before the start-up deadline. `servers` names those that did not."""

    def __init__(self, message: str, servers: Sequence[str]):
        super().__init__(message)
        self.servers = tuple(servers)
