#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test command: set up the environment if needed, then run the CPU test suite.
# GPU tests live in tests/gpu/ and are run by hand on an accelerator machine (see README).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./setup.sh
# Slurm and munge for tests/cpu/test_slurm.py (the submit scripts under a real one-node Slurm cluster):
# installed with apt-get when missing and running as root; otherwise a message, and those tests say why.
tests/cpu/install_slurm.sh
exec .venv/bin/python -m pytest tests/cpu "$@"
