# SPDX-License-Identifier: Apache-2.0
"""An `OwnedGym` for plain (loop-less) test code: started on an event loop of its own, batches run blocking.

In production the agent loop manager creates the one `BackgroundLoop`, hands it to `connect_gym` and awaits
`gym.connection.collect` on it. Tests that drive a Gym directly have no manager, so:
- `gym_config(config_paths, head_port, ...)` is the validated environments file for them (`NeMoGymConfig`), the training
  model server's config put first, as the shipped YAMLs do.
- `start_gym(config, policy)` starts a `LoopOwningGym`: an `OwnedGym` on a `BackgroundLoop` it owns, closed by
  its `shutdown()` after the Gym's own teardown (and so also at interpreter exit, through the exit hooks).
- `collect_blocking(gym, examples, deadline_s, ...)` runs `gym.connection.collect` on the Gym's loop and waits
  for it; the batch deadline bounds it and the loop's timeout (30 s more) backs it.

For the OwnedGym tests (`tests/cpu/unit/gym/test_owned_launch.py` and its neighbours,
`tests/cpu/integration/test_gym_runtime.py`): the wheel's workplace and math configs (`WORKPLACE_CONFIG`,
`MATH_CONFIG`), `gym_processes` (the live server processes of one head port), and a policy stub steered by markers
in the prompt (`PolicyStub`; `stub_math_row` writes them).

For tests of the agent loop manager's Gym (`test_manager_exit.py`, `test_manager_lifetime.py`): the manager reads
its environments file, which `write_math_plugin(path, head_port, ...)` writes for the math environment; their
policy is a `PolicyStub` too (`tests/cpu/conftest.py`'s `policy_stub_address`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.over_http.collect import RowOutcome
from recipe.nemo_gym.gym.owned.launch import OwnedGym
from recipe.nemo_gym.gym.types import PolicyServers
from tests.support.helpers import ChatCompletionStub, chat_completion, math_row, nemo_gym_processes

TRAINING_MODEL_SERVER_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
WORKPLACE_CONFIG = "resources_servers/workplace_assistant/configs/workplace_assistant.yaml"
MATH_CONFIG = "resources_servers/math_with_judge/configs/math_with_judge.yaml"


def write_math_plugin(path: Path, head_port: int, *, log_dir: Path | None = None) -> Path:
    """The environments file of NeMo Gym's math environment over the training model server, its head server on
    `head_port` (tests find its processes by it), at `path`."""
    logs = f"  log_dir: {log_dir}\n" if log_dir else ""
    path.write_text(
        f"""nemo_gym:
  config_paths: [{TRAINING_MODEL_SERVER_CONFIG}, {MATH_CONFIG}]
  head_server: {{port: {head_port}}}
{logs}timeouts: {{startup_s: 600, batch_s: 300}}
"""
    )
    return path


def gym_config(
    config_paths: Sequence[str], head_port: int, *, timeouts: Mapping[str, Any] | None = None, **nemo_gym: Any
) -> NeMoGymConfig:
    """The environments file for a Gym of these environments on `head_port` (`nemo_gym` keys, `timeouts` as given)."""
    paths = [TRAINING_MODEL_SERVER_CONFIG, *(p for p in config_paths if p != TRAINING_MODEL_SERVER_CONFIG)]
    section = {"config_paths": paths, "head_server": {"port": head_port}, **nemo_gym}
    return NeMoGymConfig.model_validate({"nemo_gym": section, "timeouts": dict(timeouts or {})})


def policy_servers(url: str, model_name: str = "policy") -> PolicyServers:
    return PolicyServers((url,), model_name)


class LoopOwningGym(OwnedGym):
    """An `OwnedGym` that closes its loop once shut down (the loop was made for it by `start_gym`). Only the Gym that
    `start` returned owns it: a failed attempt's shutdown must leave it open, since `OwnedGym.start` may start once
    more on the same loop (a launcher whose Ray missed Ray's start-up deadline, which a busy machine causes)."""

    owns_loop = False

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            if self.owns_loop and not self.loop.in_loop_thread():
                self.loop.close()


def start_gym(config: NeMoGymConfig, policy_servers: PolicyServers) -> OwnedGym:
    """`OwnedGym.start(config, policy_servers, loop=...)` on a new `BackgroundLoop` that its `shutdown()` closes."""
    loop = BackgroundLoop(name="nemo-gym-test-loop")
    try:
        gym = LoopOwningGym.start(config, policy_servers, loop=loop)
    except BaseException:
        loop.close()
        raise
    gym.owns_loop = True
    return gym


def collect_blocking(
    gym: OwnedGym,
    examples: Sequence[Mapping[str, Any]],
    deadline_s: float,
    health_check_interval_s: float = 2.0,
) -> list[RowOutcome]:
    """`gym.connection.collect(...)` from a thread without an event loop: run on `gym.loop`, blocking until done."""
    assert gym.connection is not None
    coro = gym.connection.collect(examples, deadline_s, health_check_interval_s=health_check_interval_s)
    return gym.loop.run(coro, timeout=deadline_s + 30.0, what="NeMo Gym batch")


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
