# SPDX-License-Identifier: Apache-2.0
"""`PlatformCPU`: verl's platform interface for a host with no accelerator (registered by `activate`).

verl 0.9.1 resolves its device through `verl.plugin.platform.get_platform()`; `VERL_PLATFORM=cpu` selects this
class. Ray still has to hand each worker a "GPU" (verl's placement groups ask for one per worker), so the Ray
resource stays `GPU` (the trainer starts Ray with one logical GPU) while the torch device is `cpu` and the
collective backend is gloo. Device-only calls (seeding, caches, profiling) are no-ops.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase


class _CPUDeviceModule(ModuleType):
    """`torch.cpu` plus the memory-statistics calls verl makes on `torch.<device>` (reported as 0 on CPU)."""

    def __init__(self) -> None:
        super().__init__("verl_nemo_gym_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"  # verl's FLOPs table knows "CPU", as for torch.cpu itself

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed
    # The "device" generator is torch's CPU generator: verl's checkpoints save and restore it under "cpu".
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)


_DEVICE_MODULE = _CPUDeviceModule()


class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:  # type: ignore[override]
        # verl passes this straight to `.to(...)` / `torch.device(...)`; an integer there means cuda:<n>.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
