#!/usr/bin/env bash
# The test command: set up the environment if needed, then run the CPU test suite.
# GPU tests live in tests/gpu/ and are run by hand on an accelerator machine (see README).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
./setup.sh
exec .venv/bin/python -m pytest tests/cpu "$@"
