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
#   BACKEND=cpu DRY_RUN=1 ...                  # the same job on the CPU backend: a CPU test checks that it differs
#                                              # from the GPU command by the backend's additions alone
#
# Environment: VENV (default <repo>/.venv), WORK_DIR (default: a new temporary folder; holds the data and, per
# strategy, its job file, checkpoints and train.log), MODEL_PATH (default: the tiny model, built on first use).
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
    MODEL_PATH=$("$PY" -c 'from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir; print(tiny_qwen3_dir())')
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

write_job() {  # strategy -> path of its job file (jobs/multienv.yaml's keys, sized for one GPU)
    local dir="$WORK_DIR/$1"
    mkdir -p "$dir"
    cat >"$dir/gpu_e2e_$1.yaml" <<EOF
backend: ${BACKEND:-gpu}
model: "$MODEL_PATH"
checkpoint_dir: "$dir/checkpoints"
environments: "$REPO_DIR/recipe/nemo_gym/configs/multienv.yaml"
data: {train_files: ["$WORK_DIR/train.jsonl"], val_files: ["$WORK_DIR/val.jsonl"]}
cluster: {nnodes: 1, gpus_per_node: 1, ray_port: ${RAY_PORT:-6391}, ray_dashboard_port: ${RAY_DASHBOARD_PORT:-8275},
          ray_join_timeout_s: 180, stop_grace_s: 30}
training: {strategy: $1, train_batch_size: 4, rollout_n: 2, ppo_mini_batch_size: 4, micro_batch_size_per_gpu: 2,
           max_prompt_length: 8192, max_response_length: 1024, gpu_memory_utilization: 0.4,
           total_training_steps: $TRAINING_STEPS, save_freq: -1, test_freq: -1, val_before_train: false}
logging: {project: nemo_gym_e2e, loggers: [console]}
EOF
    echo "$dir/gpu_e2e_$1.yaml"
}

EXTRA_OVERRIDES=(
    actor_rollout_ref.rollout.enforce_eager=true
    data.dataloader_num_workers=0
)

# Megatron's modules are checked before anything runs (the submit script checks them again before Ray starts):
# without them the Megatron run cannot start, and the FSDP run before it would have been spent for nothing.
if [[ " $STRATEGIES " == *" megatron "* && "${DRY_RUN:-0}" != 1 ]]; then
    PYTHONPATH="$REPO_DIR" "$PY" -m recipe.nemo_gym.launch.preflight megatron ||
        { echo "run_gpu_e2e: STRATEGIES includes megatron (see above), or run STRATEGIES=fsdp" >&2; exit 1; }
fi

failed=()
for strategy in $STRATEGIES; do
    job=$(write_job "$strategy")
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        JOB="$job" PYTHON="$PY" "$REPO_DIR/submit_multienv.sh" "${EXTRA_OVERRIDES[@]}"
        continue
    fi
    LOG="$WORK_DIR/$strategy/train.log"
    echo "run_gpu_e2e: training with $strategy in $WORK_DIR/$strategy (log: $LOG)" >&2
    rc=0
    JOB="$job" PYTHON="$PY" "$REPO_DIR/submit_multienv.sh" "${EXTRA_OVERRIDES[@]}" 2>&1 | tee "$LOG" || rc=$?
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
