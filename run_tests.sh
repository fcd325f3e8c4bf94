#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test command: set up the environment if needed, then run the CPU test suite.
# GPU tests live in tests/gpu/ and are run by hand on an accelerator machine (see README).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./setup.sh
# Slurm and munge for tests/cpu/e2e/test_slurm*.py (the submit scripts under a real one-node Slurm cluster):
# installed with apt-get when missing and running as root; otherwise a message, and those tests say why.
tests/cpu/install_slurm.sh
# Two pytest-xdist workers (NG_TEST_WORKERS), each taking whole modules in the order tests/cpu/conftest.py gives them:
# one takes the modules that start a trainer or verl's vLLM server (one at a time fits in 24 GB), the other the rest.
# NeMo Gym runs from .venv-gym (0.7.0), except in test_end_to_end_gym_0_4.py (0.4.0, from the trainer's .venv).
# The suite measures its cost (tests/support/suite_cost.py): time per module, a sampler's peak memory, a summary.
# It also times a fixed workload before and after (the machine's speed: on a shared machine it varies with the hour).
NG_SUITE_COST_DIR="$PWD/outputs/suite-cost/$(date -u +%Y%m%d-%H%M%S)"
export NG_SUITE_COST_DIR
mkdir -p "$NG_SUITE_COST_DIR"
.venv/bin/python -m tests.support.suite_cost probe "$NG_SUITE_COST_DIR" before
.venv/bin/python -m tests.support.suite_cost sample "$NG_SUITE_COST_DIR" &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT
status=0
NG_SUITE_COST_LABEL=suite .venv/bin/python -m pytest tests/cpu -n "${NG_TEST_WORKERS:-2}" --dist loadfile \
    --no-loadscope-reorder "$@" || status=$?
kill "$sampler" && wait "$sampler" || true
.venv/bin/python -m tests.support.suite_cost probe "$NG_SUITE_COST_DIR" after
.venv/bin/python -m tests.support.suite_cost report "$NG_SUITE_COST_DIR"
exit "$status"
