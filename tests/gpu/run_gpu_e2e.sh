#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU end-to-end: two real GRPO steps of verl 0.9.1 (`python -m verl.trainer.main_ppo`, DataProto trainer,
# verl's real vLLM rollouts) on one GPU, once with FSDP and once with Megatron, with NeMo Gym's math_with_judge
# and workplace_assistant environments (recipe/nemo_gym/configs/multienv.yaml) and the tiny random-weight Qwen3
# model, launched through submit_multienv.sh exactly as a user would (local mode: no Slurm). It is the
# main_ppo command the CPU tests run (tests/cpu/e2e/test_main_ppo.py), with verl's vLLM instead of the CPU backend.
# Each console log must show, on every step: a finite loss, a reward, episodes collected, zero episodes with
# broken token contiguity; the actor-vs-rollout probability gap (training/rollout_probs_diff_max) is reported.
#
#   tests/gpu/run_gpu_e2e.sh                   # needs one GPU and <repo>/.venv (./setup.sh)
#   STRATEGIES=fsdp tests/gpu/run_gpu_e2e.sh   # one engine only (default: "fsdp megatron")
#   DRY_RUN=1 tests/gpu/run_gpu_e2e.sh         # print the trainer's argument lists only (the CPU tests do this)
#   TRAINING_BACKEND=cpu DRY_RUN=1 ...         # the same job on the CPU backend: a CPU test checks that it differs
#                                              # from the GPU command by the backend's additions alone
#
# Environment: VENV (default <repo>/.venv), WORK_DIR (default: a new temporary folder; holds the data and, per
# strategy, config.env, checkpoints and train.log), MODEL_PATH (default: the tiny model, built on first use).
set -euo pipefail

# Metrics read from verl's console log (names as logged; the NeMo Gym ones arrive under timing_s/).
LOSS_METRIC="actor/pg_loss"
REWARD_METRIC="critic/score/mean"
EPISODES_METRIC="timing_s/nemo_gym/all/episodes"
CONTIGUITY_METRIC="timing_s/nemo_gym/all/failed/contiguity_broken"
PROBS_DIFF_METRIC="training/rollout_probs_diff_max"
TRAINING_STEPS=2
STRATEGIES="${STRATEGIES:-fsdp megatron}"

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV="${VENV:-$REPO_DIR/.venv}"
PY="$VENV/bin/python"
[[ -x "$PY" ]] || { echo "run_gpu_e2e: no Python at $PY (run ./setup.sh or set VENV)" >&2; exit 1; }
WORK_DIR="${WORK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/nemo_gym_e2e.XXXXXX")}"
mkdir -p "$WORK_DIR"
cd "$REPO_DIR"

if [[ -z "${MODEL_PATH:-}" ]]; then
    MODEL_PATH=$("$PY" -c 'from recipe.nemo_gym_testing.cpu_policy.tiny_model import tiny_qwen3_dir; print(tiny_qwen3_dir())')
fi

# NeMo Gym's example rows, shipped in its wheel, get the agent that runs them (the rows carry none) and are
# interleaved into one blend; the same rows serve as validation data.
"$PY" - "$WORK_DIR" <<'EOF'
import importlib.util
import json
import sys
from itertools import zip_longest
from pathlib import Path

root = Path(importlib.util.find_spec("nemo_gym").origin).parents[1] / "resources_servers"  # the wheel's, not ours
sources = {
    "math_with_judge_simple_agent": root / "math_with_judge" / "data" / "example.jsonl",
    "workplace_assistant_simple_agent": root / "workplace_assistant" / "data" / "example.jsonl",
}
per_agent = []
for agent, path in sources.items():
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    per_agent.append([{**row, "agent_ref": {"name": agent}} for row in rows])
blend = [row for group in zip_longest(*per_agent) for row in group if row is not None]
text = "".join(json.dumps(row) + "\n" for row in blend)
for name in ("train.jsonl", "val.jsonl"):
    (Path(sys.argv[1]) / name).write_text(text)
print(f"run_gpu_e2e: {len(blend)} rows ({', '.join(sources)})", file=sys.stderr)
EOF

write_config() {  # strategy -> path of its config.env
    local dir="$WORK_DIR/$1"
    mkdir -p "$dir"
    cat >"$dir/config.env" <<EOF
MODEL_PATH="$MODEL_PATH"
CHECKPOINT_DIR="$dir/checkpoints"
MULTIENV_TRAIN_FILES="$WORK_DIR/train.jsonl"
MULTIENV_VAL_FILES="$WORK_DIR/val.jsonl"
VENV="$VENV"
NNODES=1
GPUS_PER_NODE=1
STRATEGY=$1
TRAINING_BACKEND=${TRAINING_BACKEND:-gpu}
TRAIN_BATCH_SIZE=4
ROLLOUT_N=2
PPO_MINI_BATCH_SIZE=4
MICRO_BATCH_SIZE_PER_GPU=2
MAX_PROMPT_LENGTH=8192
MAX_RESPONSE_LENGTH=1024
GPU_MEMORY_UTILIZATION=0.4
TOTAL_TRAINING_STEPS=$TRAINING_STEPS
SAVE_FREQ=-1
TEST_FREQ=-1
VAL_BEFORE_TRAIN=false
PROJECT_NAME=nemo_gym_e2e
EXPERIMENT_NAME=gpu_e2e_$1
LOGGER=console
RAY_PORT=${RAY_PORT:-6391}
RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8275}
RAY_JOIN_TIMEOUT_S=180
STOP_GRACE_S=30
EOF
    echo "$dir/config.env"
}

# Small-run settings that config.env does not cover: no CUDA graphs (faster start), no loader processes.
EXTRA_OVERRIDES=(
    actor_rollout_ref.rollout.enforce_eager=true
    data.dataloader_num_workers=0
)

# Megatron's modules are checked before anything runs (the submit script checks them again before Ray starts):
# without them the Megatron run cannot start, and the FSDP run before it would have been spent for nothing.
if [[ " $STRATEGIES " == *" megatron "* && "${DRY_RUN:-0}" != 1 ]]; then
    PYTHONPATH="$REPO_DIR" "$PY" -m recipe.nemo_gym.preflight megatron ||
        { echo "run_gpu_e2e: STRATEGIES includes megatron (see above), or run STRATEGIES=fsdp" >&2; exit 1; }
fi

failed=()
for strategy in $STRATEGIES; do
    config=$(write_config "$strategy")
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        CONFIG_ENV="$config" "$REPO_DIR/submit_multienv.sh" "${EXTRA_OVERRIDES[@]}"
        continue
    fi
    LOG="$WORK_DIR/$strategy/train.log"
    echo "run_gpu_e2e: training with $strategy in $WORK_DIR/$strategy (log: $LOG)" >&2
    rc=0
    CONFIG_ENV="$config" "$REPO_DIR/submit_multienv.sh" "${EXTRA_OVERRIDES[@]}" 2>&1 | tee "$LOG" || rc=$?
    if ((rc != 0)); then
        echo "run_gpu_e2e: FAILED ($strategy): the training job exited with status $rc (log: $LOG)" >&2
        failed+=("$strategy")
        continue
    fi
    "$PY" "$REPO_DIR/tests/gpu/check_e2e_log.py" "$LOG" --steps "$TRAINING_STEPS" \
        --loss-metric "$LOSS_METRIC" --reward-metric "$REWARD_METRIC" \
        --episodes-metric "$EPISODES_METRIC" --contiguity-metric "$CONTIGUITY_METRIC" \
        --report-metric "$PROBS_DIFF_METRIC" || failed+=("$strategy")
done
if ((${#failed[@]})); then
    echo "run_gpu_e2e: FAILED: ${failed[*]}" >&2
    exit 1
fi
if [[ "${DRY_RUN:-0}" != 1 ]]; then
    echo "run_gpu_e2e: passed: $STRATEGIES" >&2
fi
