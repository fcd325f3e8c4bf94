#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Train with verl on NeMo Gym's math environment (math_with_judge, judge off): GRPO, vLLM rollouts, FSDP or
# Megatron (STRATEGY in config.env).
#
#   sbatch --nodes=<NNODES> --gpus-per-node=<GPUS_PER_NODE> submit_math.sh [extra verl overrides...]
#   ./submit_math.sh [extra verl overrides...]            # one machine, no Slurm
#   DRY_RUN=1 ./submit_math.sh                            # print the trainer's argument list, start nothing
#
# Settings come from config.env (CONFIG_ENV=<file> to use another; see config.env.example). Rows without an
# agent_ref (like NeMo Gym's example data) are routed to MATH_DEFAULT_AGENT.
#SBATCH --job-name=nemo-gym-math
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail

# The repository root: REPO_DIR if set, else this script's folder, else (sbatch runs a spool copy of the
# script) the folder sbatch was called from.
if [[ -z "${REPO_DIR:-}" ]]; then
    REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    [[ -f "$REPO_DIR/scripts_common.sh" ]] || REPO_DIR="${SLURM_SUBMIT_DIR:-$PWD}"
fi
[[ -f "$REPO_DIR/scripts_common.sh" ]] || { echo "submit: ERROR: no scripts_common.sh in $REPO_DIR; set REPO_DIR" >&2; exit 1; }
# shellcheck source=scripts_common.sh
source "$REPO_DIR/scripts_common.sh"
ng_check_repo
ng_load_config
ng_main "$REPO_DIR/recipe/nemo_gym/configs/math.yaml" MATH_TRAIN_FILES MATH_VAL_FILES math \
    "+data.default_agent_name=${MATH_DEFAULT_AGENT:-math_with_judge_simple_agent}" "$@"
