# SPDX-License-Identifier: Apache-2.0
"""Activation module of the CPU training backend: name it in `VERL_USE_EXTERNAL_MODULES` (test support only).

verl 0.9.1 imports the modules listed there at the end of `verl/__init__.py`, in every process that imports
verl: the trainer driver, the TaskRunner, every FSDP worker and every rollout server actor. Importing this one:

1. refuses any verl other than 0.9.1 (every registration and patch below was checked against it);
2. registers `PlatformCPU` as verl platform `cpu` (verl's public `PlatformRegistry`; selected by
   `VERL_PLATFORM=cpu`);
3. applies `patches.dedupe_process_group_backend`;
4. registers the rollout `cpu_vllm`: its replica in verl's public `RolloutReplicaRegistry`, and its in-worker
   adapter in `verl.workers.rollout.base._ROLLOUT_REGISTRY`, a module-level dict with no public registration
   function in verl 0.9.1 (this is the one private write; the key is new, so nothing of verl's is replaced).
"""

from __future__ import annotations

import verl

from recipe.nemo_gym_testing.cpu_training import ROLLOUT_NAME, SUPPORTED_VERL

if verl.__version__ != SUPPORTED_VERL:
    raise RuntimeError(
        f"the CPU training backend was checked against verl {SUPPORTED_VERL} only; this is verl {verl.__version__}. "
        "Its platform, patch and rollout registration must be re-checked before use."
    )


def _load_replica():
    from recipe.nemo_gym_testing.cpu_training.rollout import CPURolloutReplica

    return CPURolloutReplica


def _activate() -> None:
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from recipe.nemo_gym_testing.cpu_training.patches import dedupe_process_group_backend
    from recipe.nemo_gym_testing.cpu_training.platform import PlatformCPU

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    dedupe_process_group_backend()
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = (  # verl 0.9.1: no public registration
        "recipe.nemo_gym_testing.cpu_training.rollout.CPUServerAdapter"
    )


_activate()
