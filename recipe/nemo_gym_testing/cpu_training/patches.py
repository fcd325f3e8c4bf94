# SPDX-License-Identifier: Apache-2.0
"""The one change verl 0.9.1 needs to train on CPU, isolated here (applied by `activate`).

verl builds its process-group backend as `f"cpu:gloo,{device}:{backend}"` (`verl/utils/distributed.py`,
`initialize_global_process_group_ray`). With the CPU platform that is `"cpu:gloo,cpu:gloo"`, which torch rejects
as a duplicate device. `dedupe_process_group_backend` wraps that function so a CPU device gets `"cpu:gloo"`; any
explicit backend a caller passes is left alone. It must run before `verl.workers.engine_workers` is imported
(that module binds the function by name), which holds for a module named in `VERL_USE_EXTERNAL_MODULES`: verl
imports those at the end of its own `__init__`. Checked against verl 0.9.1.
"""

from __future__ import annotations

import functools
import sys

_PATCHED = "__nemo_gym_cpu_backend__"


def dedupe_process_group_backend() -> None:
    import verl.utils.distributed as distributed
    from verl.utils.device import get_device_name

    original = distributed.initialize_global_process_group_ray
    if getattr(original, _PATCHED, False):
        return
    if "verl.workers.engine_workers" in sys.modules:
        raise RuntimeError(
            "verl.workers.engine_workers was imported before the CPU backend patch: name "
            "recipe.nemo_gym_testing.cpu_training.activate in VERL_USE_EXTERNAL_MODULES"
        )

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and get_device_name() == "cpu":
            backend = "cpu:gloo"
        return original(timeout_second=timeout_second, backend=backend)

    setattr(initialize_global_process_group_ray, _PATCHED, True)
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
