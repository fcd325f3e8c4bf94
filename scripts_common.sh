# shellcheck shell=bash
# Shared code of submit_math.sh and submit_multienv.sh: sourced, never executed.
#
# Contract (what a submit script relies on):
# - A submit script sets REPO_DIR, sources this file, calls `ng_check_repo`, `ng_load_config` (config.env),
#   then `ng_main <env-config-yaml> <train-files-var> <val-files-var> <experiment> [extra overrides...]`, the
#   whole job: check the pinned stack, build the `python -m verl.trainer.main_ppo` argument list, then either print it (DRY_RUN=1: one argument per line on stdout, nothing started) or start Ray
#   (under Slurm: one `ray start --block` task per node through srun; without SLURM_JOB_ID: one local head),
#   wait until every node has joined (bounded by RAY_JOIN_TIMEOUT_S), run the trainer, and exit with its
#   status.
# - The job fails as a whole: if the trainer or any Ray piece exits, everything else is stopped (bounded by
#   STOP_GRACE_S) and the script exits non-zero naming what died. The EXIT trap always tears Ray down.
# - The plugin reaches every Ray worker (vLLM server actors included) through environment variables exported
#   before `ray start` on every node (raylets pass their environment to the workers they spawn):
#   PYTHONPATH=<repo> and VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.vllm_plugin (verl/__init__.py imports
#   it in every process). The latter is also put in the job's Ray runtime_env
#   (+ray_kwargs.ray_init.runtime_env.env_vars...), which verl 0.9.1's run_ppo merges over its defaults, so a
#   cluster started without it still gets it.
# - Every function's failure message starts with "submit:" and names the variable, file or node involved.

NG_PIN_VERL="${NG_PIN_VERL:-0.9.1}"
NG_PIN_NEMO_GYM="${NG_PIN_NEMO_GYM:-0.4.0}"
NG_PIN_VLLM="${NG_PIN_VLLM:-0.24.0}"
NG_EXTERNAL_MODULES="recipe.nemo_gym.vllm_plugin"
NG_MANAGER_CLASS="recipe.nemo_gym.agent_loop.NeMoGymAgentLoopManager"
NG_DATASET_CLASS="NeMoGymJSONLDataset"

ng_log() { echo "submit: $*" >&2; }
ng_die() {
    echo "submit: ERROR: $*" >&2
    exit 1
}

# Single-quote a value for a Hydra override so that paths with spaces or Hydra-special characters stay one
# string. Hydra's quoted strings cannot hold the quote character itself: ng_refuse_quotes checks the values
# beforehand, in the main shell (a failure inside $(ng_q ...) would not stop the script).
ng_q() { printf "'%s'" "$1"; }

ng_refuse_quotes() {  # variable-name...
    local var
    for var in "$@"; do
        [[ "${!var:-}" != *"'"* ]] || ng_die "$var contains a single quote, which a Hydra override cannot carry"
    done
}

# "a,b,c" -> "['a','b','c']" (a Hydra list of quoted strings); empty items are dropped.
ng_hydra_list() {
    local IFS=, item out=""
    local -a items
    read -r -a items <<<"$1"
    for item in "${items[@]}"; do
        [[ -n "$item" ]] || continue
        out+="${out:+,}$(ng_q "$item")"
    done
    printf '[%s]' "$out"
}

ng_require_int() {  # name value
    [[ "$2" =~ ^[0-9]+$ ]] || ng_die "$1 must be a non-negative integer, got '$2' (config: $NG_CONFIG_ENV)"
}

# REPO_DIR (set by the submit script) must be this repository: absolute, with the recipe package in it.
ng_check_repo() {
    [[ -f "$REPO_DIR/recipe/nemo_gym/__init__.py" ]] || ng_die "REPO_DIR=$REPO_DIR has no recipe/nemo_gym package"
    REPO_DIR=$(cd "$REPO_DIR" && pwd)
}

# Source config.env (bash syntax; its values win over the environment) and fill in documented defaults.
ng_load_config() {
    NG_CONFIG_ENV="${CONFIG_ENV:-$REPO_DIR/config.env}"
    [[ -f "$NG_CONFIG_ENV" ]] || ng_die "config file $NG_CONFIG_ENV not found: copy config.env.example to" \
        "$REPO_DIR/config.env and fill it in, or point CONFIG_ENV at yours"
    # A trial run in a separate bash first, so that a broken line gets a message naming the file (errexit is
    # off inside a `cmd || ...` list of this shell, so a subshell would not stop at the broken line).
    bash -ec 'source "$1"' config-check "$NG_CONFIG_ENV" >/dev/null || ng_die "$NG_CONFIG_ENV failed when sourced as bash (error above; quote values with spaces)"
    set -a
    # shellcheck source=config.env.example
    source "$NG_CONFIG_ENV"
    set +a

    local var
    for var in MODEL_PATH CHECKPOINT_DIR; do
        [[ -n "${!var:-}" ]] || ng_die "$var is not set in $NG_CONFIG_ENV"
    done
    VENV="${VENV:-$REPO_DIR/.venv}"
    UV_SYNC="${UV_SYNC:-0}"
    STRATEGY="${STRATEGY:-fsdp}"
    NNODES="${NNODES:-1}"
    GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
    PROJECT_NAME="${PROJECT_NAME:-nemo_gym}"
    TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-64}"
    ROLLOUT_N="${ROLLOUT_N:-8}"
    PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-16}"
    MICRO_BATCH_SIZE_PER_GPU="${MICRO_BATCH_SIZE_PER_GPU:-2}"
    MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-2048}"
    MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-4096}"
    LR="${LR:-1e-6}"
    USE_KL_LOSS="${USE_KL_LOSS:-false}"
    KL_LOSS_COEF="${KL_LOSS_COEF:-0.001}"
    ROLLOUT_TP="${ROLLOUT_TP:-1}"
    GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.6}"
    MEGATRON_TP="${MEGATRON_TP:-1}"
    MEGATRON_PP="${MEGATRON_PP:-1}"
    TOTAL_EPOCHS="${TOTAL_EPOCHS:-1}"
    TOTAL_TRAINING_STEPS="${TOTAL_TRAINING_STEPS:-}"
    SAVE_FREQ="${SAVE_FREQ:-50}"
    TEST_FREQ="${TEST_FREQ:-10}"
    VAL_BEFORE_TRAIN="${VAL_BEFORE_TRAIN:-true}"
    WANDB_API_KEY="${WANDB_API_KEY:-}"
    if [[ -z "${LOGGER:-}" ]]; then
        if [[ -n "$WANDB_API_KEY" ]]; then LOGGER="console,wandb"; else LOGGER="console"; fi
    fi
    RAY_PORT="${RAY_PORT:-6379}"
    RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
    RAY_JOIN_TIMEOUT_S="${RAY_JOIN_TIMEOUT_S:-600}"
    RAY_POLL_INTERVAL_S="${RAY_POLL_INTERVAL_S:-5}"
    RAY_TEMP_DIR="${RAY_TEMP_DIR:-}"
    STOP_GRACE_S="${STOP_GRACE_S:-60}"

    for var in NNODES GPUS_PER_NODE TRAIN_BATCH_SIZE ROLLOUT_N PPO_MINI_BATCH_SIZE MICRO_BATCH_SIZE_PER_GPU \
        MAX_PROMPT_LENGTH MAX_RESPONSE_LENGTH ROLLOUT_TP MEGATRON_TP MEGATRON_PP TOTAL_EPOCHS RAY_PORT \
        RAY_DASHBOARD_PORT RAY_JOIN_TIMEOUT_S RAY_POLL_INTERVAL_S STOP_GRACE_S; do
        ng_require_int "$var" "${!var}"
    done
    [[ -z "$TOTAL_TRAINING_STEPS" ]] || ng_require_int TOTAL_TRAINING_STEPS "$TOTAL_TRAINING_STEPS"
    case "$STRATEGY" in
        fsdp | megatron) ;;
        *) ng_die "STRATEGY must be fsdp or megatron, got '$STRATEGY' (config: $NG_CONFIG_ENV)" ;;
    esac
    PYTHON="$VENV/bin/python"
}

# Data files: a comma-separated list in the named variable; every file must exist (the dataset reads only
# local files).
ng_check_data_files() {  # variable-name
    local var=$1 file
    local -a files
    [[ -n "${!var:-}" ]] || ng_die "$var is not set in $NG_CONFIG_ENV"
    IFS=, read -r -a files <<<"${!var}"
    for file in "${files[@]}"; do
        [[ -z "$file" || -f "$file" ]] || ng_die "$var: data file $file does not exist"
    done
}

# Optional `uv sync --frozen` from the repository's lock into $VENV, then the exact pinned stack, read with
# importlib.metadata (no package is imported). A mismatch names every package that differs.
ng_check_stack() {
    if [[ "$UV_SYNC" == 1 ]]; then
        local uv="${UV:-$(command -v uv || true)}"
        [[ -n "$uv" ]] || ng_die "UV_SYNC=1 but no uv found (put it on PATH or set UV=/path/to/uv)"
        if [[ "${DRY_RUN:-0}" == 1 ]]; then
            ng_log "DRY_RUN: would run: UV_PROJECT_ENVIRONMENT=$VENV $uv sync --frozen --project $REPO_DIR"
        else
            ng_log "installing the locked stack into $VENV (uv sync --frozen)"
            UV_PROJECT_ENVIRONMENT="$VENV" "$uv" sync --frozen --project "$REPO_DIR" ||
                ng_die "uv sync --frozen into $VENV failed"
        fi
    fi
    [[ -x "$PYTHON" ]] || ng_die "no Python at $PYTHON: set VENV in $NG_CONFIG_ENV (or UV_SYNC=1 to build it)"
    local report
    if ! report=$("$PYTHON" - "$NG_PIN_VERL" "$NG_PIN_NEMO_GYM" "$NG_PIN_VLLM" 2>&1 <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

wanted = {"verl": sys.argv[1], "nemo-gym": sys.argv[2], "vllm": sys.argv[3]}
bad = []
for name, pin in wanted.items():
    try:
        found = version(name)
    except PackageNotFoundError:
        found = "not installed"
    if found != pin:
        bad.append(f"{name} {found} (need {pin})")
if bad:
    print("; ".join(bad))
    sys.exit(1)
EOF
    ); then
        ng_die "the environment $VENV does not hold the pinned stack: $report." \
            "Install it with UV_SYNC=1 (uv sync --frozen from $REPO_DIR/uv.lock)"
    fi
}

# Fill NG_OVERRIDES with every verl override of this job. Hydra keys that verl 0.9.1's config lacks carry `+`
# (the manager class exists only on the AgentLoopConfig dataclass, not in rollout.yaml).
ng_build_overrides() {  # env-config-yaml train-files-var val-files-var experiment
    local env_yaml=$1 train_var=$2 val_var=$3 experiment=$4
    ng_check_data_files "$train_var"
    ng_check_data_files "$val_var"
    ng_refuse_quotes REPO_DIR MODEL_PATH CHECKPOINT_DIR PROJECT_NAME EXPERIMENT_NAME NEMO_GYM_CONFIG \
        "$train_var" "$val_var"
    NG_OVERRIDES=(
        trainer.use_v1=false
        algorithm.adv_estimator=grpo
        # By module name, not file path: verl's file loader names the module custom_module_<hash>, which a
        # DataLoader worker started with spawn cannot import to unpickle the dataset.
        data.custom_cls.path=pkg://recipe.nemo_gym.dataset
        "data.custom_cls.name=$NG_DATASET_CLASS"
        "data.train_files=$(ng_hydra_list "${!train_var}")"
        "data.val_files=$(ng_hydra_list "${!val_var}")"
        "data.train_batch_size=$TRAIN_BATCH_SIZE"
        "data.max_prompt_length=$MAX_PROMPT_LENGTH"
        "data.max_response_length=$MAX_RESPONSE_LENGTH"
        "actor_rollout_ref.model.path=$(ng_q "$MODEL_PATH")"
        "actor_rollout_ref.actor.optim.lr=$LR"
        "actor_rollout_ref.actor.ppo_mini_batch_size=$PPO_MINI_BATCH_SIZE"
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO_BATCH_SIZE_PER_GPU"
        "actor_rollout_ref.actor.use_kl_loss=$USE_KL_LOSS"
        "actor_rollout_ref.actor.kl_loss_coef=$KL_LOSS_COEF"
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$MICRO_BATCH_SIZE_PER_GPU"
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.mode=async
        actor_rollout_ref.rollout.multi_turn.enable=true
        actor_rollout_ref.rollout.calculate_log_probs=true
        "actor_rollout_ref.rollout.n=$ROLLOUT_N"
        "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP"
        "actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_MEMORY_UTILIZATION"
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$MICRO_BATCH_SIZE_PER_GPU"
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=$NG_MANAGER_CLASS"
        "actor_rollout_ref.rollout.agent.agent_loop_config_path=$(ng_q "${NEMO_GYM_CONFIG:-$env_yaml}")"
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=$NG_EXTERNAL_MODULES"
        "trainer.logger=[$LOGGER]"
        "trainer.project_name=$(ng_q "$PROJECT_NAME")"
        "trainer.experiment_name=$(ng_q "${EXPERIMENT_NAME:-$experiment}")"
        "trainer.nnodes=$NNODES"
        "trainer.n_gpus_per_node=$GPUS_PER_NODE"
        "trainer.default_local_dir=$(ng_q "$CHECKPOINT_DIR")"
        "trainer.save_freq=$SAVE_FREQ"
        "trainer.test_freq=$TEST_FREQ"
        "trainer.total_epochs=$TOTAL_EPOCHS"
        "trainer.val_before_train=$VAL_BEFORE_TRAIN"
    )
    if [[ -n "$TOTAL_TRAINING_STEPS" ]]; then
        NG_OVERRIDES+=("trainer.total_training_steps=$TOTAL_TRAINING_STEPS")
    fi
    if [[ "$STRATEGY" == megatron ]]; then
        # verl 0.9.1 selects Megatron through the model_engine defaults group (ppo_megatron_trainer.yaml is a
        # deprecated alias for exactly this). The reference model follows the actor's parallel sizes.
        NG_OVERRIDES+=(
            model_engine=megatron
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$MEGATRON_TP"
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$MEGATRON_PP"
        )
    fi
}

# Count the nodes `ray status` reports as Active or Idle (both of Ray 2.60's formats list them as
# " <count> <node type>" lines under those headings). Reads the status text on stdin, prints an integer.
ng_count_ray_nodes() {
    awk '
        /^(Active|Idle):[[:space:]]*$/ { in_section = 1; next }
        /^[^[:space:]]/ { in_section = 0 }
        in_section && /^[[:space:]]+[0-9]+[[:space:]]+[^[:space:]]/ { total += $1 }
        END { print total + 0 }
    '
}

# Poll the cluster until `expected` nodes are in. Fails when the deadline passes (naming how many joined and
# the last status seen) or, at once, when a watched process (a `ray start --block` task) has exited.
ng_wait_for_ray_nodes() {  # address expected timeout_s [pid name]...
    local address=$1 expected=$2 timeout_s=$3
    shift 3
    local -a watch=("$@")
    local deadline=$((SECONDS + timeout_s)) status count=0 i
    while true; do
        status=$(timeout 60 ray status --address "$address" 2>&1) || true
        count=$(ng_count_ray_nodes <<<"$status")
        if ((count >= expected)); then
            ng_log "Ray cluster at $address has $count of $expected nodes"
            return 0
        fi
        for ((i = 0; i < ${#watch[@]}; i += 2)); do
            kill -0 "${watch[i]}" 2>/dev/null ||
                ng_die "${watch[i + 1]} exited before the Ray cluster at $address formed ($count of $expected nodes)"
        done
        if ((SECONDS >= deadline)); then
            ng_die "Ray cluster at $address has $count of $expected nodes after ${timeout_s} s" \
                "(RAY_JOIN_TIMEOUT_S); last 'ray status':"$'\n'"$status"
        fi
        sleep "$RAY_POLL_INTERVAL_S"
    done
}

NG_PIDS=()
NG_NAMES=()
ng_track() { NG_PIDS+=("$1") && NG_NAMES+=("$2"); }

# TERM a process, wait up to STOP_GRACE_S for it, then KILL it.
ng_stop_pid() {  # pid name
    local pid=$1 name=$2 deadline=$((SECONDS + STOP_GRACE_S))
    kill -0 "$pid" 2>/dev/null || return 0
    ng_log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            ng_log "$name (pid $pid) ignored SIGTERM for ${STOP_GRACE_S} s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 1
    done
    wait "$pid" 2>/dev/null || true
}

# EXIT trap: stop the trainer first (it owns the Ray job), then every Ray piece, newest first.
ng_teardown() {
    local rc=$? i
    trap - EXIT INT TERM
    [[ -z "$NG_TICK_PID" ]] || kill "$NG_TICK_PID" 2>/dev/null || true
    for ((i = ${#NG_PIDS[@]} - 1; i >= 0; i--)); do
        ng_stop_pid "${NG_PIDS[i]}" "${NG_NAMES[i]}"
    done
    exit "$rc"
}

ng_start_ray_slurm() {
    local -a nodes
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    local count=${#nodes[@]} head=${nodes[0]}
    ((count == NNODES)) || ng_die "config.env NNODES=$NNODES but Slurm allocated $count node(s) (${nodes[*]});" \
        "submit with: sbatch --nodes=$NNODES ..."
    local head_ip
    head_ip=$(srun --overlap --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{print $1}')
    [[ -n "$head_ip" ]] || ng_die "could not read the IP address of head node $head"
    NG_RAY_ADDRESS="$head_ip:$RAY_PORT"
    ng_log "starting the Ray head on $head ($NG_RAY_ADDRESS), $count node(s), $GPUS_PER_NODE GPU(s) each"
    local -a head_args=(--head --node-ip-address="$head_ip" --port="$RAY_PORT" --dashboard-port="$RAY_DASHBOARD_PORT")
    [[ -z "$RAY_TEMP_DIR" ]] || head_args+=(--temp-dir="$RAY_TEMP_DIR")
    srun --overlap --export=ALL --nodes=1 --ntasks=1 -w "$head" \
        ray start "${head_args[@]}" --num-gpus="$GPUS_PER_NODE" --disable-usage-stats --block &
    ng_track $! "Ray head (srun on $head)"
    ng_wait_for_ray_nodes "$NG_RAY_ADDRESS" 1 "$RAY_JOIN_TIMEOUT_S" "${NG_PIDS[0]}" "${NG_NAMES[0]}"
    if ((count > 1)); then
        srun --overlap --export=ALL --nodes=$((count - 1)) --ntasks=$((count - 1)) --ntasks-per-node=1 \
            --exclude="$head" ray start --address="$NG_RAY_ADDRESS" --num-gpus="$GPUS_PER_NODE" \
            --disable-usage-stats --block &
        ng_track $! "Ray workers (srun on the $((count - 1)) other node(s))"
    fi
    ng_wait_for_ray_nodes "$NG_RAY_ADDRESS" "$count" "$RAY_JOIN_TIMEOUT_S" \
        "${NG_PIDS[0]}" "${NG_NAMES[0]}" "${NG_PIDS[-1]}" "${NG_NAMES[-1]}"
}

ng_start_ray_local() {
    ((NNODES == 1)) || ng_die "NNODES=$NNODES needs Slurm (no SLURM_JOB_ID here): submit with sbatch"
    NG_RAY_ADDRESS="127.0.0.1:$RAY_PORT"
    ng_log "no Slurm job: starting a local Ray head on port $RAY_PORT with $GPUS_PER_NODE GPU(s)"
    local -a head_args=(--head --port="$RAY_PORT" --dashboard-port="$RAY_DASHBOARD_PORT")
    [[ -z "$RAY_TEMP_DIR" ]] || head_args+=(--temp-dir="$RAY_TEMP_DIR")
    ray start "${head_args[@]}" --num-gpus="$GPUS_PER_NODE" --disable-usage-stats --block &
    ng_track $! "local Ray head"
    ng_wait_for_ray_nodes "$NG_RAY_ADDRESS" 1 "$RAY_JOIN_TIMEOUT_S" "${NG_PIDS[0]}" "${NG_NAMES[0]}"
}

# Wait for whichever tracked process ends first. The trainer ending ends the job with its status; any Ray
# piece ending first is a failure of the whole job (the EXIT trap then stops the rest).
NG_SUPERVISE_TICK_S="${NG_SUPERVISE_TICK_S:-10}"
NG_TICK_PID=""
ng_supervise() {  # trainer-pid
    local trainer=$1 i rc=0
    while true; do
        if ! kill -0 "$trainer" 2>/dev/null; then
            wait "$trainer" || rc=$?
            if ((rc == 0)); then ng_log "training finished"; else ng_log "ERROR: the trainer exited with status $rc"; fi
            return "$rc"
        fi
        for ((i = 0; i < ${#NG_PIDS[@]}; i++)); do
            kill -0 "${NG_PIDS[i]}" 2>/dev/null || ng_die "${NG_NAMES[i]} exited while training ran; stopping the job"
        done
        # `wait -n` returns as soon as a child exits, but (bash 5.2) not for one that exited before it was
        # called; the tick child bounds that window to NG_SUPERVISE_TICK_S.
        sleep "$NG_SUPERVISE_TICK_S" &
        NG_TICK_PID=$!
        wait -n || true
        kill "$NG_TICK_PID" 2>/dev/null || true
        wait "$NG_TICK_PID" 2>/dev/null || true
        NG_TICK_PID=""
    done
}

ng_main() {  # env-config-yaml train-files-var val-files-var experiment [user overrides...]
    local env_yaml=$1 train_var=$2 val_var=$3 experiment=$4
    shift 4
    ng_build_overrides "$env_yaml" "$train_var" "$val_var" "$experiment"
    NG_OVERRIDES+=("$@")
    ng_check_stack
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        ng_log "DRY_RUN: the trainer command, one argument per line (nothing started); workers get" \
            "PYTHONPATH=$REPO_DIR VERL_USE_EXTERNAL_MODULES=$NG_EXTERNAL_MODULES"
        printf '%s\n' "$PYTHON" -m verl.trainer.main_ppo "${NG_OVERRIDES[@]}"
        return 0
    fi

    # Exported before `ray start`, so every raylet and the workers it spawns inherit them.
    export PATH="$VENV/bin:$PATH"
    export PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}"
    export VERL_USE_EXTERNAL_MODULES="$NG_EXTERNAL_MODULES"
    export RAY_USAGE_STATS_ENABLED=0
    [[ -z "$WANDB_API_KEY" ]] || export WANDB_API_KEY
    trap ng_teardown EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT

    if [[ -n "${SLURM_JOB_ID:-}" ]]; then ng_start_ray_slurm; else ng_start_ray_local; fi

    ng_log "starting the trainer against Ray at $NG_RAY_ADDRESS"
    RAY_ADDRESS="$NG_RAY_ADDRESS" "$PYTHON" -m verl.trainer.main_ppo "${NG_OVERRIDES[@]}" &
    local trainer=$!
    ng_track "$trainer" "the trainer (verl.trainer.main_ppo)"
    ng_supervise "$trainer"
}
