#!/usr/bin/env bash
# The main job on its embedded default: set up if needed, then one real batch of NeMo Gym's math and workplace
# environments through the manager, on CPU, with a tiny random-weight policy. Extra arguments go to the demo
# (e.g. --policy scripted).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./setup.sh
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python -m recipe.nemo_gym.demo "$@"
