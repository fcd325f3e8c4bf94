#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Borrow the nodes, nothing else: start Ray on every node of a Slurm allocation (without Slurm: one local head), run
# the launcher (`python -m recipe.nemo_gym.launch run JOB`) on the head node, and tear every node down when it ends.
# Everything about the job (its checks, verl's command, its supervision and failure cause) is the launcher's.
#
#   ray_on_slurm.sh JOB [--set key=value]... [verl overrides...]     (what submit_*.sh run)
#
# Environment: PYTHON (default <repo>/.venv/bin/python; in a container, python), DRY_RUN=1 (print the trainer's
# command and start nothing), CONTAINER_IMAGE (run Ray and the launcher in this image on every node, through
# pyxis/enroot: srun --container-image), CONTAINER_MOUNTS (default: the repository at the same path, plus
# CONTAINER_MOUNTS_EXTRA). The job's Ray settings (NG_NNODES, NG_RAY_*, NG_STOP_GRACE_S) and the environment of its
# processes come from `launch ray-env JOB`, exported before `ray start` so that every raylet hands them on; so does
# Ray's token authentication, with a fresh token of the job unless RAY_AUTH_MODE or a token is set already.
set -euo pipefail

REPO_DIR=$(cd "${REPO_DIR:-$(dirname "${BASH_SOURCE[0]}")}" && pwd)
[[ -f "$REPO_DIR/recipe/nemo_gym/launch/__main__.py" ]] || { echo "ray_on_slurm: no launcher in $REPO_DIR; set REPO_DIR" >&2; exit 1; }
(($# >= 1)) || { echo "usage: ray_on_slurm.sh JOB [--set key=value]... [verl overrides...]" >&2; exit 2; }
log() { echo "ray_on_slurm: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CONTAINER=()
if [[ -n "${CONTAINER_IMAGE:-}" ]]; then
    CONTAINER=(--container-image="$CONTAINER_IMAGE" --container-mounts="${CONTAINER_MOUNTS:-$REPO_DIR:$REPO_DIR}${CONTAINER_MOUNTS_EXTRA:+,$CONTAINER_MOUNTS_EXTRA}" --container-workdir="$REPO_DIR")
    PYTHON="${PYTHON:-python}"
fi
PYTHON="${PYTHON:-$REPO_DIR/.venv/bin/python}"
LAUNCH=("$PYTHON" -m recipe.nemo_gym.launch)
export PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}"

# Run a command on one node (the head unless named): a Slurm step in the job's container, or here. Called in a
# subshell only (`$(...)` or `&`), which it becomes (exec): a signal to its pid reaches the command itself.
on_node() {  # [-w node] [-J step name] command...
    local -a where=() name=()
    [[ "$1" != -w ]] || { where=(-w "$2"); shift 2; }
    [[ "$1" != -J ]] || { name=(--job-name="$2"); shift 2; }
    if [[ -n "${SLURM_JOB_ID:-}" ]]; then
        exec srun --overlap --export=ALL --nodes=1 --ntasks=1 "${where[@]}" "${name[@]}" "${CONTAINER[@]}" "$@"
    fi
    [[ ${#CONTAINER[@]} == 0 ]] || die "CONTAINER_IMAGE needs a Slurm job (pyxis runs containers in job steps)"
    exec "$@"
}

if [[ "${DRY_RUN:-0}" == 1 ]]; then
    [[ ${#CONTAINER[@]} == 0 ]] || log "DRY_RUN: every node runs Ray and the launcher in: srun ${CONTAINER[*]}"
    exec "${LAUNCH[@]}" dry-run "$@"
fi
# The head is the allocation's first node; `ray-env` runs there and exports NG_HEAD_IP, the address others reach.
NODES=()
[[ -z "${SLURM_JOB_ID:-}" ]] || mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD=${NODES[0]:-localhost}
settings=$(on_node -w "$HEAD" "${LAUNCH[@]}" ray-env "$@") || die "the job did not pass its checks (the error is above)"
eval "$settings"
read -r -a RAY_ARGS <<<"$NG_RAY_START_ARGS"
[[ -z "$NG_RAY_TEMP_DIR" ]] || RAY_ARGS+=(--temp-dir="$NG_RAY_TEMP_DIR")
RAY_ARGS+=(--disable-usage-stats --block)
# A folder of the job's own on every node (Ray's session, vLLM's sockets, verl's locks), removed at the end: under
# TMPDIR, or /tmp where Ray's socket paths would be too long. Exported before `ray start`: srun hands it to each node.
JOB_START=$(date +%s)  # what vLLM and verl leave on a node after this is the job's (recipe/nemo_gym/launch/leftovers.py)
JOB_TMP=$(mktemp -d "$NG_JOB_TEMP_PARENT/ngjob-XXXXXXXX") || die "cannot create a folder in $NG_JOB_TEMP_PARENT"
export TMPDIR="$JOB_TMP" NG_OUTCOME_FILE="$JOB_TMP/outcome"

PIDS=() NAMES=()
track() { PIDS+=("$1") && NAMES+=("$2"); }
LAUNCHER_STEP=nemo-gym-launcher
# srun answers SIGTERM by killing its step's tasks at once (SIGKILL, "srun: forcing job termination"; seen with
# Slurm 22.05), which would leave the launcher no time to stop the trainer and say how the job ended: the launcher's
# SIGTERM goes to its step instead, through scancel, and its srun ends when the launcher does.
term_launcher() {  # pid
    local step=""
    if [[ -n "${SLURM_JOB_ID:-}" ]]; then
        step=$(timeout 10 squeue --noheader --steps --jobs="$SLURM_JOB_ID" --format='%i %j' |
            awk -v name="$LAUNCHER_STEP" '$2 == name { print $1; exit }') || true
    fi
    if [[ -z "$step" ]]; then
        kill -TERM "$1" 2>/dev/null || true
        return 0
    fi
    # In a job of several nodes, Slurm 22.05's scancel signals the step, then reports "Invalid job id specified"
    # (the job's other nodes do not hold the step): its status says nothing. That the launcher stops is what
    # counts, and stop_pid's grace bounds the wait for it.
    timeout 10 scancel --signal=TERM "$step" 2>/dev/null || true
}
stop_pid() {  # pid name grace: TERM, then KILL after the grace
    local deadline=$((SECONDS + $3))
    kill -0 "$1" 2>/dev/null || return 0
    if [[ "$1" == "${LAUNCHER:-}" ]]; then term_launcher "$1"; else kill -TERM "$1" 2>/dev/null || true; fi
    while kill -0 "$1" 2>/dev/null; do
        ((SECONDS < deadline)) || { log "$2 ignored SIGTERM for $3 s; killing it"; kill -KILL "$1" 2>/dev/null; break; }
        sleep 1
    done
    wait "$1" 2>/dev/null || true
}
# What outlives the job's steps: a daemon the trainer started in a session of its own, which no process group the
# launcher stops holds; a Ray process when `ray start --block` was killed (Ray's dashboard agent was seen 30 s after
# such a job). Every process of the job carries its TMPDIR (exported before the first step; Ray renames its processes,
# so their command lines cannot tell): those still running on a node get SIGTERM (a process with a hook of its own
# runs it), then SIGKILL after 5 s. POSIX sh, $1 the job's folder; run with TMPDIR set back to the folder's parent,
# so that the clean-up (its srun, its shell, its grep) never matches itself.
# shellcheck disable=SC2016  # expanded by the shell that runs it
STOP_LEFT='(
    left=$(grep -lzxF -- "TMPDIR=$1" /proc/[0-9]*/environ 2>/dev/null | sed "s|^/proc/||; s|/environ$||")
    for p in $left; do
        name=$(cat "/proc/$p/comm" 2>/dev/null) && kill -TERM "$p" 2>/dev/null &&
            echo "ray_on_slurm: stopping pid $p ($name) on $(uname -n), which the job left running" >&2
    done
    for _ in 1 2 3 4 5; do
        running="" && for p in $left; do ! kill -0 "$p" 2>/dev/null || running="$running $p"; done
        [ -n "$running" ] || exit 0
        sleep 1
    done
    for p in $running; do kill -KILL "$p" 2>/dev/null && echo "ray_on_slurm: killed pid $p after 5 s" >&2; done
    true
)'
teardown() {  # the launcher first (it stops the trainer, with its own grace), then Ray, newest first
    local rc=$? i outcome
    trap - EXIT INT TERM
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        stop_pid "${PIDS[i]}" "${NAMES[i]}" $((i == ${#PIDS[@]} - 1 ? 2 * NG_STOP_GRACE_S + 30 : NG_STOP_GRACE_S))
    done
    TMPDIR="$NG_JOB_TEMP_PARENT" sh -c "$STOP_LEFT" stop-left "$JOB_TMP"
    [[ ! -s "$NG_OUTCOME_FILE" ]] || outcome=$(<"$NG_OUTCOME_FILE")
    rm -rf "$JOB_TMP"
    if [[ -n "${SLURM_JOB_ID:-}" && "$NG_NNODES" -gt 1 ]]; then  # the head's launcher cleaned the head only
        # shellcheck disable=SC2016  # the inner shell expands its own arguments
        TMPDIR="$NG_JOB_TEMP_PARENT" srun --overlap --nodes="$NG_NNODES" --ntasks="$NG_NNODES" \
            --ntasks-per-node=1 "${CONTAINER[@]}" \
            /bin/sh -c "$STOP_LEFT"'; "$2" -m recipe.nemo_gym.launch.leftovers "$3"; rm -rf "$1"' \
            stop-left "$JOB_TMP" "$PYTHON" "$JOB_START" || log "could not clean $JOB_TMP and /dev/shm on every node"
    fi
    [[ -z "${outcome:-}" ]] || echo "$outcome" >&2  # how the job ended, last: the launcher's words
    [[ -z "${DIED:-}" ]] || log "ERROR: the job failed because $DIED"
    exit "$rc"
}
# A Ray piece that ends while the trainer runs ends the job; after the launcher's last words, the job's last line
# says which one (its node): whatever the trainer saw of it (an actor's death, a server's) came first.
ray_died() {
    DIED="$1 exited while the job ran"
    log "ERROR: $DIED; stopping the job"
    exit 1
}
trap teardown EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

if [[ -z "${SLURM_JOB_ID:-}" ]]; then
    ((NG_NNODES == 1)) || die "cluster.nnodes=$NG_NNODES needs Slurm (no SLURM_JOB_ID here): submit with sbatch"
elif ((${#NODES[@]} != NG_NNODES)); then
    die "the job asks for cluster.nnodes=$NG_NNODES but Slurm allocated ${#NODES[@]} node(s) (${NODES[*]});" \
        "submit with: sbatch --nodes=$NG_NNODES ..."
fi
log "starting the Ray head on $HEAD ($NG_HEAD_IP:$NG_RAY_PORT), $NG_NNODES node(s), each with: $NG_RAY_START_ARGS"
on_node -w "$HEAD" ray start --head --node-ip-address="$NG_HEAD_IP" --port="$NG_RAY_PORT" \
    --dashboard-port="$NG_RAY_DASHBOARD_PORT" --ray-client-server-port="$NG_RAY_CLIENT_SERVER_PORT" "${RAY_ARGS[@]}" &
track $! "the Ray head on $HEAD"
export RAY_ADDRESS="$NG_HEAD_IP:$NG_RAY_PORT"
deadline=$((SECONDS + NG_RAY_JOIN_TIMEOUT_S))
until (: >"/dev/tcp/$NG_HEAD_IP/$NG_RAY_PORT") 2>/dev/null; do  # the head's port answers: the others may join
    kill -0 "${PIDS[0]}" 2>/dev/null || die "${NAMES[0]} exited before it answered on $RAY_ADDRESS"
    ((SECONDS < deadline)) || die "the Ray head did not answer on $RAY_ADDRESS within $NG_RAY_JOIN_TIMEOUT_S s"
    sleep 1
done
if ((NG_NNODES > 1)); then  # the others join once the head node is in: a worker's `ray start` waits only ~40 s for it
    on_node -w "$HEAD" "$PYTHON" -m recipe.nemo_gym.launch.cluster "$RAY_ADDRESS" 1 "$NG_RAY_JOIN_TIMEOUT_S" 2 &
    waiter=$!
    while kill -0 "$waiter" 2>/dev/null; do
        kill -0 "${PIDS[0]}" 2>/dev/null || { kill "$waiter"; die "${NAMES[0]} exited before its node joined"; }
        sleep 1
    done
    wait "$waiter" || die "the Ray head on $HEAD did not join its own cluster (above)"
fi
for node in "${NODES[@]:1}"; do  # one step per node, so that a Ray that dies is named by its node
    # The job's folder was made on the head; each node's TMPDIR is its own (node-local /tmp), so it makes its own.
    # shellcheck disable=SC2016  # the node's shell expands its own TMPDIR
    on_node -w "$node" /bin/sh -c 'mkdir -p "$TMPDIR" && exec "$@"' ray-worker \
        ray start --address="$RAY_ADDRESS" "${RAY_ARGS[@]}" &
    track $! "the Ray worker on $node"
done

# The launcher waits until every node has joined, then runs the trainer. Whichever ends first ends the job: the
# launcher with its status, a Ray piece as a failure (the EXIT trap then stops the rest).
on_node -w "$HEAD" -J "$LAUNCHER_STEP" "${LAUNCH[@]}" run "$@" &
LAUNCHER=$!
track "$LAUNCHER" "the launcher"
while true; do
    if ! kill -0 "$LAUNCHER" 2>/dev/null; then
        rc=0 && wait "$LAUNCHER" || rc=$?
        exit "$rc"
    fi
    for ((i = 0; i < ${#PIDS[@]} - 1; i++)); do
        kill -0 "${PIDS[i]}" 2>/dev/null || ray_died "${NAMES[i]}"
    done
    sleep 5 &  # `wait -n` wakes when any child ends: this one bounds the wait
    TICK=$!
    wait -n || true
    kill "$TICK" 2>/dev/null || true
done
