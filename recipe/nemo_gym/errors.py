# SPDX-License-Identifier: Apache-2.0
"""The root of every error the plugin raises, and its four families.

Catch `NeMoGymPluginError` to catch everything the plugin raises for a run's condition, and nothing else. Each
error is in one family, which says what the user can do about it:

- `ConfigError` (a `ValueError`): what the user wrote or installed is wrong: the environments file, a data file or row,
  a NeMo Gym config or version, the installed vLLM, a tokenizer or chat template the splice cannot make exact,
  Megatron's modules. Found before the part it concerns runs.
- `ServerError` (a `RuntimeError`): a server the plugin starts or talks to did not start, died, or stopped
  answering. `servers` names them (NeMo Gym server names, or policy base URLs).
- `RolloutError` (a `RuntimeError`): a whole batch could not complete: aborted (a server died with episodes
  pending, the deadline passed) or over the failure budget. The step fails.
- `RefusedError` (a `ValueError`): one request or one episode was refused (the splice's rules, packing's
  invariants); the run goes on and the episode is counted as failed.

Classes raised by one module live there (`gym/errors.py` holds NeMo Gym's). A failed episode is a value
(`failures.EpisodeFailure`), not an error. Python's own `ValueError` and `TypeError` remain for a caller's misuse
of a function (a bad argument), which is a bug in the caller, not a condition of the run.
"""

from __future__ import annotations

from collections.abc import Sequence


class NeMoGymPluginError(Exception):
    """Every error the plugin raises for a run's condition."""


class ConfigError(NeMoGymPluginError, ValueError):
    """What the user wrote or installed is wrong; the message names the file, key, row or package."""


class ServerError(NeMoGymPluginError, RuntimeError):
    """A server the plugin starts or talks to did not start, died or stopped answering; `servers` names them."""

    def __init__(self, message: str, servers: Sequence[str] = ()):
        super().__init__(message)
        self.servers = tuple(servers)


class RolloutError(NeMoGymPluginError, RuntimeError):
    """A whole batch could not complete; the training step fails."""


class RefusedError(NeMoGymPluginError, ValueError):
    """One request or one episode was refused; the run goes on without it."""
