#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build (or check) the project's two environments:
#   .venv      the trainer's: Python 3.12 from pyenv, every package from uv.lock (verl, vLLM, the plugin, tests);
#   .venv-gym  NeMo Gym's (0.7), which the plugin starts as a process tree of its own: Python 3.13, every package
#              from packaging/gym-requirements.txt (Gym and what the shipped configs' servers need).
#
# Quick no-op when both already match their locks. Never downloads a Python interpreter; needs only PyPI.
# Usage: ./setup.sh            (runtime + test dependencies)
#
# NeMo Gym 0.5+ declares requires-python >= 3.13.14. Where only an older 3.13 is found (pyenv's 3.13.0 here), the
# packages are resolved for 3.13.14 (uv --python-version) and installed onto that interpreter, and one line says
# so: no 3.13.14 language feature is used by Gym's code, but it is not the interpreter Gym's release was tested on.
# With no 3.13 at all it stops with a message (`uv python install 3.13`, or PYTHON313=/path/to/python3.13).
#
# vLLM comes in one of two builds of the same release (pyproject's `gpu` and `cpu` extras, never both):
# NG_VLLM_BUILD=gpu|cpu chooses; unset, it is `gpu` where `nvidia-smi -L` lists a GPU and `cpu` elsewhere. The
# launcher refuses a job whose backend does not match the build this environment holds.
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

GYM_PYTHON_FLOOR=3.13.14  # nemo-gym 0.5+'s requires-python

# The newest Python 3.13 found: $PYTHON313, pyenv's, then python3.13 on PATH. Prints "<path> <version>".
find_python313() {
    local candidates=() best="" best_version="" candidate version
    [[ -n "${PYTHON313:-}" ]] && candidates+=("$PYTHON313")
    if command -v pyenv >/dev/null 2>&1; then
        for candidate in "$(pyenv root)"/versions/3.13*/bin/python3.13; do candidates+=("$candidate"); done
    fi
    command -v python3.13 >/dev/null 2>&1 && candidates+=("$(command -v python3.13)")
    for candidate in "${candidates[@]}"; do
        [[ -x "$candidate" ]] || continue
        version=$("$candidate" -c 'import platform; print(platform.python_version())' 2>/dev/null) || continue
        [[ "$version" == 3.13.* ]] || continue
        if [[ -z "$best" ]] || [[ "$(printf '%s\n%s\n' "$best_version" "$version" | sort -V | tail -1)" == "$version" ]]; then
            best=$candidate best_version=$version
        fi
    done
    [[ -n "$best" ]] || return 1
    echo "$best $best_version"
}

stamp_of_lock() { { sha256sum uv.lock pyproject.toml setup.sh; echo "$VLLM_BUILD"; } | sha256sum | cut -c1-16; }
stamp_of_gym_lock() { sha256sum packaging/gym-requirements.txt packaging/wordle-guesses.txt setup.sh | sha256sum | cut -c1-16; }

trainer_ready() { [[ -x .venv/bin/python && -f .venv/.lock-stamp && "$(cat .venv/.lock-stamp)" == "$(stamp_of_lock)" ]]; }
gym_ready() { [[ -x .venv-gym/bin/python && -f .venv-gym/.lock-stamp && "$(cat .venv-gym/.lock-stamp)" == "$(stamp_of_gym_lock)" ]]; }

if trainer_ready && gym_ready; then
    exit 0  # both environments already match their locks
fi

PY=$(find_python312)
UV=.cache/bootstrap/bin/uv
if [[ ! -x "$UV" ]] || [[ "$("$UV" --version | cut -d' ' -f2)" != "$UV_VERSION" ]]; then
    echo "setup.sh: installing uv $UV_VERSION into .cache/bootstrap" >&2
    "$PY" -m venv .cache/bootstrap
    .cache/bootstrap/bin/python -m pip install --quiet "uv==$UV_VERSION"
fi

if ! gym_ready; then
    if ! found=$(find_python313); then
        echo "setup.sh: NeMo Gym 0.7 needs Python >= $GYM_PYTHON_FLOOR and no Python 3.13 was found (pyenv versions," \
            "PATH); install one (uv python install 3.13, pyenv install 3.13) or set PYTHON313" >&2
        exit 1
    fi
    read -r PY313 PY313_VERSION <<<"$found"
    target=()
    if [[ "$(printf '%s\n%s\n' "$PY313_VERSION" "$GYM_PYTHON_FLOOR" | sort -V | head -1)" != "$GYM_PYTHON_FLOOR" ]]; then
        echo "setup.sh: NeMo Gym 0.7 needs Python >= $GYM_PYTHON_FLOOR; only $PY313_VERSION found ($PY313): installing" \
            "packages resolved for $GYM_PYTHON_FLOOR onto it (uv --python-version; see docs/nemo-gym.md)" >&2
        target=(--python-version "$GYM_PYTHON_FLOOR")
    fi
    # Two packages of the shipped configs' servers ship no wheel for Python 3.13, so uv builds them from source:
    # pycosat (reasoning_gym's) with a C compiler, editdistance (ruler2's) with a C++ one.
    if ! command -v cc >/dev/null; then
        echo "setup.sh: a C compiler is needed to build pycosat for .venv-gym (apt-get install gcc)" >&2
        exit 1
    fi
    if ! command -v c++ >/dev/null; then
        echo "setup.sh: a C++ compiler is needed to build editdistance for .venv-gym (apt-get install g++)" >&2
        exit 1
    fi
    echo "setup.sh: syncing .venv-gym with packaging/gym-requirements.txt (Python: $PY313 $PY313_VERSION)" >&2
    start=$(date +%s)
    rm -rf .venv-gym
    "$UV" venv --quiet --python "$PY313" .venv-gym
    "$UV" pip sync --quiet --compile-bytecode --python .venv-gym/bin/python "${target[@]}" packaging/gym-requirements.txt
    # wordle's word list, which Gym's wheel does not ship and its generate_data.py downloads (see the file's header).
    cp packaging/wordle-guesses.txt "$(echo .venv-gym/lib/python3.*/site-packages/resources_servers/wordle/data)/guesses.txt"
    stamp_of_gym_lock > .venv-gym/.lock-stamp
    echo "setup.sh: NeMo Gym environment ready in $(( $(date +%s) - start )) s ($(du -sh .venv-gym | cut -f1))" >&2
fi
trainer_ready && exit 0

echo "setup.sh: syncing .venv with uv.lock (Python: $PY; vLLM build: $VLLM_BUILD)" >&2
start=$(date +%s)
# --compile-bytecode: every .pyc written now, once. Each trainer run starts a dozen Python processes that import
# torch, vLLM, verl and NeMo Gym; where PYTHONDONTWRITEBYTECODE is set (it is in this project's sandbox), without
# .pyc files each of them compiles all of that from source again (importing verl's trainer: 18.6 s, 7.7 s with).
"$UV" sync --frozen --compile-bytecode --python "$PY" --extra "$VLLM_BUILD"
stamp_of_lock > .venv/.lock-stamp
echo "setup.sh: environment ready in $(( $(date +%s) - start )) s ($(du -sh .venv | cut -f1) in .venv)" >&2
