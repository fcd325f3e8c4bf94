# SPDX-License-Identifier: Apache-2.0
"""Activation module of the CPU training backend: name it in `VERL_USE_EXTERNAL_MODULES` (test support only).

verl 0.9.1 imports the modules listed there at the end of `verl/__init__.py`, in every process that imports
verl: the trainer driver, the TaskRunner, every FSDP worker and every rollout server actor. Importing this one:

1. refuses any verl other than 0.9.1 (every registration and patch below was checked against it);
2. registers `PlatformCPU` as verl platform `cpu` (verl's public `PlatformRegistry`; selected by
   `VERL_PLATFORM=cpu`);
3. applies the two patches of `patches.py`: verl's process-group backend on CPU, and, in the process that runs
   vLLM's engine, vLLM's weight prepacking turned off so verl can load weights again at every step.

The rollout itself is verl's own `rollout.name=vllm` (its `vLLMReplica`, `vLLMHttpServer` actor and weight sync)
on vLLM's CPU build, configured through verl's public config (`overrides.py`).
"""

from __future__ import annotations

import verl

from recipe.nemo_gym.cpu_backend import SUPPORTED_VERL

if verl.__version__ != SUPPORTED_VERL:
    raise RuntimeError(
        f"the CPU training backend was checked against verl {SUPPORTED_VERL} only; this is verl {verl.__version__}. "
        "Its platform, patch and rollout registration must be re-checked before use."
    )


def _activate() -> None:
    from verl.plugin.platform import PlatformRegistry

    from recipe.nemo_gym.cpu_backend.patches import dedupe_process_group_backend, keep_vllm_weights_reloadable
    from recipe.nemo_gym.cpu_backend.platform import PlatformCPU

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    dedupe_process_group_backend()
    keep_vllm_weights_reloadable()


_activate()
