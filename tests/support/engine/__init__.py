# SPDX-License-Identifier: Apache-2.0
"""verl's own vLLM rollout on vLLM's CPU build, for the tests: scripted turns played inside the real engine.

- `scripted_logits` is a vLLM logits processor that forces a `ScriptedPolicy`'s turns while the log-probs stay the
  model's own; `script_choice` picks a request's script.
- `standalone` starts verl's standalone rollout (`vLLMHttpServer` actors) for the manager's tests, and
  `shared_engine` keeps one of them for the whole test session.
"""

import os

SCRIPT_ENV = "NEMO_GYM_CPU_POLICY_SCRIPT"
"""Path of a `ScriptedPolicy` JSON file, read by `scripted_logits` in vLLM's engine process."""

SCRIPTED_PROCESSOR = "tests.support.engine.scripted_logits:ScriptedLogitsProcessor"
"""vLLM's `module:qualname` form of a logits processor class."""


def kv_cache_override(n_bytes: int) -> str:
    """verl's override that sizes vLLM's KV cache in bytes (`kv_cache_memory_bytes`, added or replaced)."""
    return f"++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={n_bytes}"


TEST_KV_CACHE_BYTES = 128 * 2**20
TEST_KV_CACHE = kv_cache_override(TEST_KV_CACHE_BYTES)
"""The KV cache of the tests' own engines and training jobs: 128 MiB (131,072 tokens of the tiny model) where the CPU
backend gives 512, since vLLM's CPU build fills it at start and so all of it is resident. It holds 14 sequences of the
longest a test allows (9,216 tokens); vLLM schedules requests within it. The suite's shared engine, which serves
512 episodes at once, keeps the backend's 512 MiB. Two engines at 512 MiB (a trainer's and a module's) were the
suite's peak, 18.2 GiB (2026-11-29)."""


def scripted_overrides(script_file: str | os.PathLike) -> list[str]:
    """What plays `script_file` inside verl's vLLM engine in a `main_ppo` job (`scripted_logits.py`): the logits
    processor, the script's path for the engine's processes, and log-probs of the raw logits (the model's own,
    before the processor)."""
    return [
        f"+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=['{SCRIPTED_PROCESSOR}']",
        "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{SCRIPT_ENV}='{script_file}'",
    ]
