#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job on its embedded default: set up if needed, then verl's real `python -m verl.trainer.main_ppo`
# with this plugin, on CPU (tiny model; NeMo Gym's math and workplace environments and our uppercase_share in one
# blend; GRPO; validation first; a checkpoint at the end). Extra arguments go to the job (e.g. --steps 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./setup.sh
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python -m recipe.nemo_gym_demo "$@"
