# SPDX-License-Identifier: Apache-2.0
"""Fixtures and harnesses of the recipe's tests and benchmarks: nothing here is part of what a user deploys.

`engine` plays scripted turns inside verl's own vLLM rollout on vLLM's CPU build, `cpu_policy` is the hand-written
policy server for the two faults the real engine cannot produce (and the manager's test harness), `gym_runtime`
runs an `OwnedGym` from plain test code and `external_gym` a NeMo Gym started apart from the trainer.
`stand_in_trainer` behaves like `main_ppo` for the launcher's own tests. `results` builds NeMo Gym results and packs
them in one call, and `vllm_render` builds vLLM's chat render objects without an engine. No module under `recipe/`
imports anything here.
"""
