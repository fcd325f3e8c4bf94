# SPDX-License-Identifier: Apache-2.0
"""Test support for the NeMo Gym recipe: nothing here is part of what a user deploys.

`cpu_training` runs verl's real trainer (`python -m verl.trainer.main_ppo`) on a machine without a GPU, so the
recipe's CI and demo exercise the whole training loop through the plugin. Users on GPU clusters never import it.
`cpu_policy` is the CPU stand-in for verl's vLLM rollout server (tiny model, scripted policies, test harness), and
`gym_runtime` runs an `OwnedGym` from plain test code. `results` builds NeMo Gym results and packs them in one
call, and `vllm_render` builds vLLM's chat render objects without an engine. No module under `recipe/nemo_gym/`
imports anything here.
"""
