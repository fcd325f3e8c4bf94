# SPDX-License-Identifier: Apache-2.0
"""Activation module: importing it arms the token-exact splice patch for vLLM in this process.

Meant to be named in verl's `VERL_USE_EXTERNAL_MODULES`, which `verl/__init__.py` (0.9.1) imports in every
process that imports verl, including the `vLLMHttpServer` Ray actors that run vLLM's OpenAI server
in-process. Set it for every Ray worker through the job's runtime environment:

    +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.vllm_plugin

(`recipe` must be importable there too, e.g. `PYTHONPATH` in the same `env_vars`.)

Importing this module is its side effect, by design; it stays cheap and does not import vLLM:
- if vLLM's chat render module is already imported, `server_patch.install()` runs now;
- otherwise a finder on `sys.meta_path` runs `install()` right after vLLM's render module (or its OpenAI
  API server module, which imports it) finishes importing, and then removes itself. Processes that never
  start a vLLM server (the trainer driver, FSDP workers that only use the engine) pay nothing.
An unsupported vLLM makes that import fail with `UnsupportedVLLMError`, i.e. when the server starts.
Without vLLM installed at all, nothing happens.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

from recipe.nemo_gym import server_patch

# Modules whose import means "a vLLM chat server is being built here". The API server module is listed so
# that a vLLM with none of the known render modules still triggers install() (which then refuses loudly).
TRIGGER_MODULES = frozenset({module for module, _ in server_patch.TARGETS} | {"vllm.entrypoints.openai.api_server"})


class _InstallAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a trigger module it wraps the real loader so install() runs after it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in TRIGGER_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _InstallingLoader(spec.loader, self)
        return spec


class _InstallingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _InstallAfterImport):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        # Disarm first: install() imports the other render module and must not re-enter through us.
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        server_patch.install()

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package, ... of the real loader
        return getattr(self._loader, name)


def _arm() -> None:
    if importlib.util.find_spec("vllm") is None:
        return
    if any(name in sys.modules for name in TRIGGER_MODULES):
        server_patch.install()
        return
    if not any(isinstance(f, _InstallAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallAfterImport())


_arm()
