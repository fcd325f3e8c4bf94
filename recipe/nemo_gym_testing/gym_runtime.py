# SPDX-License-Identifier: Apache-2.0
"""A `GymRuntime` for plain (loop-less) test code: started on an event loop of its own, batches run blocking.

In production the agent loop manager creates the one `BackgroundLoop`, passes it to `GymRuntime.start` and
awaits `GymRuntime.collect` on it. Tests that drive a runtime directly have no manager, so:
- `start_runtime(spec)` starts a `LoopOwningRuntime`: a `GymRuntime` on a `BackgroundLoop` it owns, closed by
  its `shutdown()` after the runtime's own teardown (and so also at interpreter exit, through the exit hooks).
- `collect_blocking(runtime, examples, deadline_s, ...)` runs `runtime.collect` on the runtime's loop and waits
  for it; the batch deadline bounds it and the loop's timeout (30 s more) backs it.

For the GymRuntime tests (`tests/cpu/unit/gym/test_gym_runtime_units.py`,
`tests/cpu/integration/test_gym_runtime.py`): the wheel's workplace and math configs (`WORKPLACE_CONFIG`,
`MATH_CONFIG`), `gym_processes` (the live server processes of one head port), and a policy stub steered by markers
in the prompt (`PolicyStub`; `stub_math_row` writes them).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psutil

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.collect import RowOutcome
from recipe.nemo_gym.gym.launch import GymRuntime
from recipe.nemo_gym.gym.spec import GymServersSpec
from recipe.nemo_gym_testing.helpers import ChatCompletionStub, chat_completion, math_row, nemo_gym_processes

WORKPLACE_CONFIG = "resources_servers/workplace_assistant/configs/workplace_assistant.yaml"
MATH_CONFIG = "resources_servers/math_with_judge/configs/math_with_judge.yaml"


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


def gym_processes(head_port: int) -> list[psutil.Process]:
    """Every live NeMo Gym server process of the configuration with this head port."""
    return nemo_gym_processes(head_port, with_config_path=True)


def stub_math_row(question: str, expected: str, *, answer: str, delay: float = 0.0, marker: str = "") -> dict:
    """A math row whose prompt tells the policy stub what to answer, how long to wait and what else to do."""
    return math_row(question, expected, content=f"{question} ANSWER={answer} DELAY={delay} {marker}".strip())


class PolicyStub(ChatCompletionStub):
    """Answers like vLLM's OpenAI server with token IDs; the prompt's markers choose what it does."""

    def respond(self, body: dict) -> tuple[int, dict]:
        text = " ".join(str(m.get("content")) for m in body["messages"] if m["role"] in ("user", "system"))
        if "FAIL500" in text:
            return 500, {"object": "error", "message": "policy exploded", "code": 500}
        if "HANG" in text:
            self.release.wait(120)
            return 503, {"object": "error", "message": "released"}
        delay = re.search(r"DELAY=([0-9.]+)", text)
        time.sleep(float(delay.group(1)) if delay else 0.0)
        answer = re.search(r"ANSWER=(\S+)", text)
        return 200, chat_completion(body, f"The answer is \\boxed{{{answer.group(1) if answer else '0'}}}.", (9, 8))
