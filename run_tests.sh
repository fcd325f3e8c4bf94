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
# Two pytest-xdist workers (NG_TEST_WORKERS), each taking whole modules in the order conftest.py gives them:
# most of a trainer's start-up is single-threaded imports, so two at once use both cores.
exec .venv/bin/python -m pytest tests/cpu -n "${NG_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
