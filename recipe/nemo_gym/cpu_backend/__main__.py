# SPDX-License-Identifier: Apache-2.0
"""`python -m recipe.nemo_gym.cpu_backend difference`: everything the CPU backend adds to a GPU job's
command (its Hydra overrides and the environment of every process), commented, as the README lists it. The launcher
imports the backend's `cpu_overrides` and `cpu_env` itself (`recipe/nemo_gym/launch/__main__.py`)."""

from __future__ import annotations

import sys

from recipe.nemo_gym.cpu_backend.overrides import cpu_difference


def main(argv: list[str]) -> int:
    if argv == ["difference"]:
        print(cpu_difference())
        return 0
    print("usage: python -m recipe.nemo_gym.cpu_backend difference", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
