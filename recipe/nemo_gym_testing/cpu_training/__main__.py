# SPDX-License-Identifier: Apache-2.0
"""`python -m recipe.nemo_gym_testing.cpu_training overrides|env|difference`: the CPU backend's settings.

`overrides` prints one Hydra override per line (append them to `main_ppo`'s arguments; the caller starts Ray
with `--num-gpus=1` and more `--num-cpus` than cores, and sets `RAY_ADDRESS`); `env` prints
`KEY=VALUE` lines to export before Ray and the trainer start; `difference` prints both, commented, as the README
lists them (everything a CPU job adds to the GPU command).
"""

from __future__ import annotations

import sys

from recipe.nemo_gym_testing.cpu_training.overrides import cpu_difference, cpu_env, cpu_overrides


def main(argv: list[str]) -> int:
    if argv == ["overrides"]:
        print("\n".join(cpu_overrides(start_ray=False)))
        return 0
    if argv == ["env"]:
        print("\n".join(f"{key}={value}" for key, value in cpu_env().items()))
        return 0
    if argv == ["difference"]:
        print(cpu_difference())
        return 0
    print("usage: python -m recipe.nemo_gym_testing.cpu_training overrides|env|difference", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
