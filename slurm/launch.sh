# shellcheck shell=bash
# Shared body of slurm/*.sbatch (sourced, not run).  The machine script sets
# MACHINE, RANKS_PER_NODE, CPUS_PER_TASK, SRUN_BIND (array) and THREAD_OVERRIDES
# (array of --set options), then sources this with the job's arguments:
#
#   sbatch -N <nodes> slurm/<machine>.sbatch <app> <config.yaml> [--set key=value ...]
#
# It exports HDF5_USE_FILE_LOCKING=FALSE and the config's Horovod knobs, stages
# each rank's share of the training files when the config has data.stage_dir,
# trains with --resume into runs/<app>-<job id> (the same directory after a
# requeue), forwards SLURM's warning signal to the ranks, and requeues the job
# when the trainer exits with 75 (checkpoint saved at a step boundary), or with
# 4 (no progress) while SLURM reports one of the job's nodes lost (then without
# that node: the job resumes on the nodes left, keeping its global batch).
set -euo pipefail

usage() {
    echo "usage: sbatch -N <nodes> slurm/${MACHINE}.sbatch <app> <config.yaml> [--set key=value ...]" >&2
    exit 2
}
[ "$#" -ge 2 ] || usage
APP=$1
CONFIG=$2
shift 2
OVERRIDES=("$@")

ROOT=${HPC_DL_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
JOB=${SLURM_JOB_ID:?not running under SLURM: SLURM_JOB_ID is not set}
NODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
NTASKS=$((NODES * RANKS_PER_NODE))
RUN_DIR=${RUN_DIR:-$ROOT/runs/$APP-$JOB}
PREEMPTED=75
HUNG=4
mkdir -p "$RUN_DIR"
LOG=$RUN_DIR/train.restart-${SLURM_RESTART_COUNT:-0}.log

# SLURM's warning signal may come at any time: before the trainer runs, remember it (and requeue
# instead of starting); once it runs, forward it to the ranks, which checkpoint at the next step.
TRAINER=
EARLY_SIGNAL=
# shellcheck disable=SC2317  # called from the traps below
forward() {
    if [ -z "$TRAINER" ]; then
        echo "launch: $1 received before training started" >&2
        EARLY_SIGNAL=$1
        return
    fi
    if ! kill -0 "$TRAINER" 2>/dev/null; then
        echo "launch: $1 received after the trainer had ended" >&2
        return
    fi
    echo "launch: $1 received; asking the ranks to checkpoint at their next step and stop" >&2
    kill -s USR1 "$TRAINER" 2>/dev/null || true
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

echo "launch: $MACHINE, $NODES node(s) x $RANKS_PER_NODE rank(s), $APP $CONFIG -> $RUN_DIR (log $LOG)"
# The environment the config asks for; a failure here (a bad config: exit 2 and its one-line error) ends
# the job at once: `eval "$(cmd)"` alone would go on under set -e.
ENVIRONMENT=$("$PYTHON" -m common.tools.slurm env --app "$APP" --config "$CONFIG" "${OVERRIDES[@]}") || {
    status=$?
    echo "launch: python -m common.tools.slurm env failed (exit $status); not starting" >&2
    exit "$status"
}
eval "$ENVIRONMENT"

SRUN=(srun --nodes "$NODES" --ntasks "$NTASKS" --ntasks-per-node "$RANKS_PER_NODE"
      --cpus-per-task "$CPUS_PER_TASK" "${SRUN_BIND[@]}" --kill-on-bad-exit=1)
# The site's MPI plugin (srun --mpi): pmix for Open MPI with PMIx; the site default when unset.
if [ -n "${SRUN_MPI:-}" ]; then
    SRUN+=(--mpi="$SRUN_MPI")
fi

if [ -n "${STAGE_DIR:-}" ]; then
    echo "launch: staging each rank's share of the training files to $STAGE_DIR"
    "${SRUN[@]}" "$PYTHON" -m common.tools.slurm stage --app "$APP" --config "$CONFIG" \
        "${THREAD_OVERRIDES[@]}" "${OVERRIDES[@]}" >>"$LOG" 2>&1
fi

if [ -n "$EARLY_SIGNAL" ]; then
    echo "launch: preempted ($EARLY_SIGNAL) before training; requeueing job $JOB"
    scontrol requeue "$JOB"
    exit 0
fi

"${SRUN[@]}" "$PYTHON" -m "$APP.train" --config "$CONFIG" --output-dir "$RUN_DIR" --resume \
    "${THREAD_OVERRIDES[@]}" "${OVERRIDES[@]}" >>"$LOG" 2>&1 &
TRAINER=$!

# A trapped signal interrupts `wait`: keep waiting until srun itself has ended.
while kill -0 "$TRAINER" 2>/dev/null; do
    wait "$TRAINER" || true
done
status=0
wait "$TRAINER" || status=$?

if [ "$status" -eq "$PREEMPTED" ]; then
    echo "launch: preempted with a checkpoint; requeueing job $JOB (it resumes from $RUN_DIR)"
    scontrol requeue "$JOB"
    exit 0
fi
# Exit 4: a rank saw no progress for train.hang_timeout_s, as when a node dies under the job.  If SLURM
# reports one of the job's nodes as not responding (or down) within LOST_NODE_WAIT_S, the job is requeued and
# resumes from its last checkpoint on the nodes left (submit with -N <fewer>-<nodes> to allow that; the global
# batch is kept): SLURM places no job on a node that does not respond.  (The node cannot be added to the job's
# excluded nodes: SLURM refuses that while the job runs, and a requeue ends this script at once.)  Otherwise
# the hang was not a lost node: exit 4.
if [ "$status" -eq "$HUNG" ] && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    lost=
    for _ in $(seq "${LOST_NODE_WAIT_S:-60}"); do
        lost=$(sinfo -h -N -n "$SLURM_JOB_NODELIST" -o '%N %T' 2>/dev/null \
               | awk '$2 ~ /[*]$/ || $2 ~ /^(down|fail)/ {print $1}' | sort -u | paste -sd, -)
        [ -n "$lost" ] && break
        sleep 1
    done
    if [ -n "$lost" ]; then
        if scontrol requeue "$JOB" 2>/dev/null; then
            echo "launch: a rank stopped making progress and node(s) $lost no longer respond; requeued job $JOB" \
                 "(it resumes from $RUN_DIR on responding nodes; SLURM places no job on a silent one)"
            exit 0
        fi
        restarts=$(scontrol show job "$JOB" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
        if [ "${restarts:-0}" -gt "${SLURM_RESTART_COUNT:-0}" ]; then
            echo "launch: SLURM found node(s) $lost down and requeued job $JOB itself; it resumes from $RUN_DIR" \
                 "on the nodes left"
            exit 0
        fi
        echo "launch: node(s) $lost no longer respond, but job $JOB cannot be requeued (sbatch --no-requeue?);" \
             "resubmit it with --exclude=$lost" >&2
    fi
fi
echo "launch: trainer exited with $status"
exit "$status"
