# SPDX-License-Identifier: Apache-2.0
"""Make vLLM's current platform the CPU platform; the first vLLM-related call of a CPU policy server process.

vLLM resolves `vllm.platforms.current_platform` lazily from installed plugins. The CUDA wheel on a machine
without a GPU resolves to `UnspecifiedPlatform`, on which the server's argument parser fails with "Failed to
infer device type". vLLM 0.24.0 has no public switch (no environment variable, no argument); the platform
plugin entry point would need an installed distribution. So this assigns the module attribute, which
`vllm.platforms` exports in `__all__` and which its module-level `__setattr__` is written for. Checked against
vLLM 0.24.0. It must run before any vLLM module that reads the platform is imported; importing
`vllm.platforms` itself reads nothing.
"""

from __future__ import annotations


def use_cpu_platform() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    if not isinstance(vars(platforms).get("current_platform"), CpuPlatform):
        platforms.current_platform = CpuPlatform()
