# SPDX-License-Identifier: Apache-2.0
"""Checks of the job's Python environment that must pass before Ray starts: Megatron's modules.

verl 0.9.1's Megatron engine (`model_engine=megatron`, `training.strategy: megatron` in a job) imports, inside
its Ray workers, minutes into a job:
- by default (`use_mbridge=true`, `vanilla_mbridge=false`): Megatron-Core and Megatron-Bridge
  (`verl/models/mcore/bridge.py`), which imports Transformer Engine unconditionally;
- with `vanilla_mbridge=true` (deprecated in verl): Megatron-Core and `mbridge` (`verl/models/mcore/mbridge.py`).

A missing one is a `ModuleNotFoundError` in an actor's traceback. `missing_megatron_modules` finds them without
importing anything (`importlib.util.find_spec`: importing Transformer Engine on a machine without CUDA can itself
fail), and `MegatronPrerequisiteError` says what is missing and the supported ways to get it.

    python -m recipe.nemo_gym.launch.preflight megatron [--vanilla-mbridge]    # exit 1 with the message when missing
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from recipe.nemo_gym.errors import ConfigError

# (module, what provides it)
MEGATRON_BRIDGE_PATH = (
    ("megatron.core", "Megatron-Core (PyPI: megatron-core)"),
    ("megatron.bridge", "Megatron-Bridge (verl 0.9.1's megatron extra pins megatron-bridge==0.5.2)"),
    ("transformer_engine", "Transformer Engine (imported by Megatron-Bridge)"),
)
VANILLA_MBRIDGE_PATH = (
    ("megatron.core", "Megatron-Core (PyPI: megatron-core)"),
    ("mbridge", "mbridge (PyPI: mbridge)"),
)

FIX = """\
Ways to get them:
  - run the job in a container that ships them: verl's Megatron images or NVIDIA's NeMo container (their Python
    has Megatron-Core, Megatron-Bridge and Transformer Engine built for its CUDA): CONTAINER_IMAGE=<image> for the
    submit scripts, with PYTHON=<its python> if it is not the image's `python`, or install this repository's lock
    into it;
  - or install them into this environment on a GPU node: megatron-bridge==0.5.2 with a Transformer Engine built for
    your CUDA and torch 2.11.0 (see verl's 0.9.1 'megatron' extra: megatron-core, megatron-bridge==0.5.2,
    transformer-engine, apex);
  - or use training.strategy: fsdp (model_engine=fsdp), which needs none of them.
With vanilla_mbridge=true (deprecated in verl) the path needs Megatron-Core and mbridge instead."""


class MegatronPrerequisiteError(ConfigError):
    """The Megatron path verl would take imports modules this Python environment does not have."""


def missing_megatron_modules(
    vanilla_mbridge: bool = False,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
) -> list[tuple[str, str]]:
    """(module, what provides it) for each module verl's chosen Megatron path imports that cannot be found."""
    missing = []
    for module, provider in VANILLA_MBRIDGE_PATH if vanilla_mbridge else MEGATRON_BRIDGE_PATH:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or broken
            found = False
        if not found:
            missing.append((module, provider))
    return missing


def check_megatron(vanilla_mbridge: bool = False, find_spec: Callable[[str], Any] = importlib.util.find_spec) -> None:
    """Raise `MegatronPrerequisiteError` when verl's Megatron path cannot import what it needs here."""
    missing = missing_megatron_modules(vanilla_mbridge, find_spec)
    if not missing:
        return
    path = "vanilla_mbridge=true" if vanilla_mbridge else "use_mbridge=true, vanilla_mbridge=false (verl's default)"
    listed = "\n".join(f"  - {module}: {provider}" for module, provider in missing)
    raise MegatronPrerequisiteError(
        f"the Megatron strategy cannot start: verl's Megatron path ({path}) imports modules that this Python "
        f"({sys.executable}) does not have:\n{listed}\n{FIX}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.nemo_gym.launch.preflight")
    parser.add_argument("check", choices=["megatron"])
    parser.add_argument("--vanilla-mbridge", action="store_true", help="verl's deprecated mbridge path")
    args = parser.parse_args(argv)
    try:
        check_megatron(vanilla_mbridge=args.vanilla_mbridge)
    except MegatronPrerequisiteError as e:
        print(f"preflight: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
