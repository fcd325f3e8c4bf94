#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build (or check) the project's environment in .venv: Python 3.12 from pyenv, every package from uv.lock.
#
# Quick no-op when .venv already matches uv.lock. Never downloads a Python interpreter; needs only PyPI.
# Usage: ./setup.sh            (runtime + test dependencies)
#
# vLLM comes in one of two builds of the same release (pyproject's `gpu` and `cpu` extras, never both):
# NG_VLLM_BUILD=gpu|cpu chooses; unset, it is `gpu` where `nvidia-smi -L` lists a GPU and `cpu` elsewhere. The
# submit scripts refuse a job whose TRAINING_BACKEND does not match the build this environment holds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

UV_VERSION=0.13.9
export UV_PYTHON_DOWNLOADS=never
export UV_LINK_MODE="${UV_LINK_MODE:-copy}"

find_python312() {
    if [[ -n "${PYTHON312:-}" ]]; then echo "$PYTHON312"; return; fi
    if command -v pyenv >/dev/null 2>&1; then
        local root candidate
        root=$(pyenv root)
        for candidate in "$root"/versions/3.12*/bin/python3.12; do
            [[ -x "$candidate" ]] && { echo "$candidate"; return; }
        done
    fi
    command -v python3.12 || { echo "setup.sh: no Python 3.12 found (pyenv versions, PATH, or set PYTHON312)" >&2; exit 1; }
}

VLLM_BUILD="${NG_VLLM_BUILD:-}"
if [[ -z "$VLLM_BUILD" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        VLLM_BUILD=gpu
    else
        VLLM_BUILD=cpu
    fi
fi
case "$VLLM_BUILD" in
    gpu|cpu) ;;
    *) echo "setup.sh: NG_VLLM_BUILD must be gpu or cpu, not '$VLLM_BUILD'" >&2; exit 2 ;;
esac

stamp_of_lock() { { sha256sum uv.lock pyproject.toml setup.sh; echo "$VLLM_BUILD"; } | sha256sum | cut -c1-16; }

if [[ -x .venv/bin/python && -f .venv/.lock-stamp && "$(cat .venv/.lock-stamp)" == "$(stamp_of_lock)" ]]; then
    exit 0  # environment already matches the lock
fi

PY=$(find_python312)
UV=.cache/bootstrap/bin/uv
if [[ ! -x "$UV" ]] || [[ "$("$UV" --version | cut -d' ' -f2)" != "$UV_VERSION" ]]; then
    echo "setup.sh: installing uv $UV_VERSION into .cache/bootstrap" >&2
    "$PY" -m venv .cache/bootstrap
    .cache/bootstrap/bin/python -m pip install --quiet "uv==$UV_VERSION"
fi

echo "setup.sh: syncing .venv with uv.lock (Python: $PY; vLLM build: $VLLM_BUILD)" >&2
start=$(date +%s)
# --compile-bytecode: every .pyc written now, once. Each trainer run starts a dozen Python processes that import
# torch, vLLM, verl and NeMo Gym; where PYTHONDONTWRITEBYTECODE is set (it is in this project's sandbox), without
# .pyc files each of them compiles all of that from source again (importing verl's trainer: 18.6 s, 7.7 s with).
"$UV" sync --frozen --compile-bytecode --python "$PY" --extra "$VLLM_BUILD"
stamp_of_lock > .venv/.lock-stamp
echo "setup.sh: environment ready in $(( $(date +%s) - start )) s ($(du -sh .venv | cut -f1) in .venv)" >&2
