# SPDX-License-Identifier: Apache-2.0
"""A `GymRuntime` for plain (loop-less) test code: started on an event loop of its own, batches run blocking.

In production the agent loop manager creates the one `BackgroundLoop`, passes it to `GymRuntime.start` and
awaits `GymRuntime.collect` on it. Tests that drive a runtime directly have no manager, so:
- `start_runtime(spec)` starts a `LoopOwningRuntime`: a `GymRuntime` on a `BackgroundLoop` it owns, closed by
  its `shutdown()` after the runtime's own teardown (and so also at interpreter exit, through the exit hooks).
- `collect_blocking(runtime, examples, deadline_s, ...)` runs `runtime.collect` on the runtime's loop and waits
  for it; the batch deadline bounds it and the loop's timeout (30 s more) backs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.collect import RowOutcome
from recipe.nemo_gym.gym.launch import GymRuntime
from recipe.nemo_gym.gym.spec import GymServersSpec


class LoopOwningRuntime(GymRuntime):
    """A `GymRuntime` that closes its loop once shut down (the loop was made for it by `start_runtime`)."""

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            if not self.loop.in_loop_thread():
                self.loop.close()


def start_runtime(spec: GymServersSpec) -> GymRuntime:
    """`GymRuntime.start(spec, loop=...)` on a new `BackgroundLoop` that the runtime's `shutdown()` closes."""
    loop = BackgroundLoop(name="nemo-gym-test-loop")
    try:
        return LoopOwningRuntime.start(spec, loop=loop)
    except BaseException:
        loop.close()
        raise


def collect_blocking(
    runtime: GymRuntime,
    examples: Sequence[Mapping[str, Any]],
    deadline_s: float,
    health_check_interval_s: float = 2.0,
) -> list[RowOutcome]:
    """`runtime.collect(...)` from a thread without an event loop: run on `runtime.loop`, blocking until done."""
    coro = runtime.collect(examples, deadline_s, health_check_interval_s=health_check_interval_s)
    return runtime.loop.run(coro, timeout=deadline_s + 30.0, what="NeMo Gym batch")
