# SPDX-License-Identifier: Apache-2.0
"""A CPU training backend for verl 0.9.1's `main_ppo`: test support, never part of a deployment.

verl's trainer (`trainer.use_v1=false`) runs here unmodified, with vLLM's GPU engine as the one part replaced:

- `activate` is the module named in `VERL_USE_EXTERNAL_MODULES` (verl imports it in every process). It checks
  the verl version, registers a CPU platform in verl's platform registry (`platform.PlatformCPU`, selected with
  `VERL_PLATFORM=cpu`), applies the one patch verl needs on CPU (`patches.py`), and registers the rollout
  `cpu_vllm` (`rollout.py`): a replica whose server is the CPU policy server (vLLM 0.24's own OpenAI app, engine
  replaced, splice patch on) and an in-worker adapter that syncs the actor's weights to it at every step.
- `overrides` holds the Hydra overrides and environment variables that select it; `python -m
  recipe.nemo_gym_testing.cpu_training overrides|env` prints them for shell scripts.
"""

ROLLOUT_NAME = "cpu_vllm"
"""The `actor_rollout_ref.rollout.name` under which the CPU rollout is registered."""

SUPPORTED_VERL = "0.9.1"
"""The one verl version every patch and registration here was checked against."""
