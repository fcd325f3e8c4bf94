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
# Two pytest-xdist workers (NG_TEST_WORKERS), each taking whole modules in the order conftest.py gives them, one
# of them all the modules that start a trainer or a vLLM server (one such module at a time fits in 24 GB): most of
# a trainer's start-up is single-threaded imports, so two workers use both cores. NeMo Gym runs from
# .venv-gym (Gym 0.7.0) in all of them, except test_end_to_end_gym_0_4.py: the end-to-end module again on the
# oldest Gym the plugin runs, 0.4.0, which the trainer's .venv holds.
# What the run costs, measured by the suite itself (tests/support/suite_cost.py): each pytest run writes
# its time per module into NG_SUITE_COST_DIR, a sampler beside them keeps the machine's peak memory in use, and the
# summary is printed at the end.
NG_SUITE_COST_DIR="$PWD/outputs/suite-cost/$(date -u +%Y%m%d-%H%M%S)"
export NG_SUITE_COST_DIR
mkdir -p "$NG_SUITE_COST_DIR"
.venv/bin/python -m tests.support.suite_cost sample "$NG_SUITE_COST_DIR" &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT
status=0
NG_SUITE_COST_LABEL=suite .venv/bin/python -m pytest tests/cpu -n "${NG_TEST_WORKERS:-2}" --dist loadfile \
    --no-loadscope-reorder "$@" || status=$?
kill "$sampler" && wait "$sampler" || true
.venv/bin/python -m tests.support.suite_cost report "$NG_SUITE_COST_DIR"
exit "$status"
