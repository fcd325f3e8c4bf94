#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Train with verl on a blend of NeMo Gym's math and workplace-assistant environments: GRPO, vLLM rollouts,
# FSDP or Megatron. The job is jobs/multienv.yaml (JOB=<file> runs another); copy it and fill in your paths.
#
#   sbatch --nodes=<N> --gpus-per-node=<G> submit_multienv.sh [--set key=value]... [extra verl overrides...]
#   ./submit_multienv.sh ...                  # one machine, no Slurm
#   DRY_RUN=1 ./submit_multienv.sh            # print the trainer's argument list, start nothing
#   CONTAINER_IMAGE=<image> sbatch ...     # Ray and the trainer in a container on every node (pyxis/enroot)
#SBATCH --job-name=nemo-gym-multienv
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail
# The repository: REPO_DIR, else this script's folder, else (sbatch runs a spool copy) where sbatch was called.
REPO_DIR=${REPO_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
[[ -f "$REPO_DIR/ray_on_slurm.sh" ]] || REPO_DIR=${SLURM_SUBMIT_DIR:-$PWD}
export REPO_DIR
exec "$REPO_DIR/ray_on_slurm.sh" "${JOB:-$REPO_DIR/jobs/multienv.yaml}" "$@"
