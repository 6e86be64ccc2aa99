#!/usr/bin/env bash
# A one-node SLURM cluster with munge, started by hand (no systemd), everything under one folder.
# For the tests that run the shipped slurm/*.sbatch scripts for real (tests/test_slurm_cluster.py).
#
#   scripts/local_slurm.sh up       # install the Debian packages if missing, start munged, slurmctld, slurmd;
#                                   # wait for the node to be idle; print SLURM_CONF=<path>
#   scripts/local_slurm.sh status   # the daemons and the node state; exit 0 when all are up
#   scripts/local_slurm.sh down     # stop the daemons and the job steps they started, by pid
#
# Environment: LOCAL_SLURM_DIR (the cluster's folder: created if absent; an existing one must be a real
# folder owned by this user that nobody else can write to), LOCAL_SLURM_CPUS (CPUs the node advertises,
# default 4: config_overrides lets 4 single-threaded ranks share 2 cores).  Without LOCAL_SLURM_DIR, `up`
# makes a new folder with mktemp -d and records its path in $LOCAL_SLURM_STATE (default
# ~/.local/state/hpc-dl-suite/local-slurm-dir), where status and down find it; nothing goes through a
# predictable path in a world-writable folder.  Needs root (SlurmUser=root) and, to install packages,
# apt-get.  Idempotent: `up` on a running cluster returns at once; `down` on a stopped one does nothing.
set -euo pipefail

CPUS=${LOCAL_SLURM_CPUS:-4}
STATE=${LOCAL_SLURM_STATE:-${HOME:-/root}/.local/state/hpc-dl-suite/local-slurm-dir}
PACKAGES=(slurmctld slurmd slurm-client munge openmpi-bin libopenmpi-dev)

log() { echo "local_slurm: $*" >&2; }

# The cluster's folder must be ours alone: a folder another user can write to (or a link to one) would
# let them plant links that root then writes through.
check_own_folder() {
    local folder=$1 mode
    if [ -L "$folder" ] || [ ! -d "$folder" ]; then
        log "$folder: not a folder (or a symbolic link); refusing to use it"
        exit 2
    fi
    mode=$(stat -c '%a' "$folder")
    if [ "$(stat -c '%u' "$folder")" != "$(id -u)" ] || (( 8#$mode & 8#022 )); then
        log "$folder: owned by another user or writable by others (mode $mode); refusing to use it"
        exit 2
    fi
}

# ROOT: LOCAL_SLURM_DIR, else the folder a previous `up` recorded, else (for `up`) a new mktemp -d folder.
resolve_root() {
    local create=$1
    if [ -n "${LOCAL_SLURM_DIR:-}" ]; then
        ROOT=$LOCAL_SLURM_DIR
        if [ ! -e "$ROOT" ] && [ ! -L "$ROOT" ] && [ "$create" = 1 ]; then
            mkdir -p "$(dirname "$ROOT")"
            mkdir -m 700 "$ROOT"
        fi
    elif [ -s "$STATE" ] && [ ! -L "$STATE" ]; then
        ROOT=$(cat "$STATE")
    elif [ "$create" = 1 ]; then
        mkdir -p "$(dirname "$STATE")"
        chmod 700 "$(dirname "$STATE")"
        ROOT=$(mktemp -d "${TMPDIR:-/tmp}/hpc-dl-suite-slurm.XXXXXXXX")
        write_file "$STATE" <<<"$ROOT"
    else
        ROOT=
        return 0
    fi
    if [ ! -e "$ROOT" ] && [ ! -L "$ROOT" ]; then
        ROOT=   # recorded or named, but gone: nothing to stop
        return 0
    fi
    check_own_folder "$ROOT"
    CONF=$ROOT/etc/slurm.conf
    SOCKET=$ROOT/munge/munge.socket.2
}

# Standard input into FILE, by a new file of a unique name beside it renamed over it: a link planted at
# FILE is replaced, never followed.
write_file() {
    local target=$1 temporary
    temporary=$(mktemp "$(dirname "$target")/.$(basename "$target").XXXXXXXX")
    cat > "$temporary"
    mv -f "$temporary" "$target"
}

# A pid is alive unless gone or a zombie (PID 1 here reaps late).
alive() {
    local pid=$1
    [ -n "$pid" ] && [ -r "/proc/$pid/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"
}

pid_of() {
    if [ -s "$ROOT/run/$1.pid" ]; then cat "$ROOT/run/$1.pid"; fi
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null || missing+=(x)
    command -v munged >/dev/null && command -v mpirun >/dev/null || missing+=(x)
    [ "${#missing[@]}" = 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        log "SLURM, munge or Open MPI missing and cannot be installed here (needs root and apt-get)"
        exit 3
    fi
    log "installing ${PACKAGES[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

write_config() {
    chmod 755 "$ROOT"   # only we write here; munged wants the socket's folders traversable
    mkdir -p "$ROOT"/{etc,munge,run,log,state,spool,tmp}
    chmod 755 "$ROOT/munge"   # munged refuses a socket folder others cannot traverse
    if [ ! -s "$ROOT/etc/munge.key" ]; then
        mungekey --create --keyfile="$ROOT/etc/munge.key" >/dev/null 2>&1 \
            || dd if=/dev/urandom of="$ROOT/etc/munge.key" bs=1024 count=1 status=none
    fi
    chmod 600 "$ROOT/etc/munge.key"
    local host memory
    host=$(hostname -s)
    memory=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n 1)
    memory=$(( memory * 9 / 10 ))
    write_file "$CONF" <<EOF
# Written by scripts/local_slurm.sh: a one-node test cluster.
ClusterName=hpcdl
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCKET
CredType=cred/munge
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.log
SlurmctldPort=${LOCAL_SLURM_PORT:-16817}
SlurmdPort=$(( ${LOCAL_SLURM_PORT:-16817} + 1 ))
TmpFS=$ROOT/tmp
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=pmix
ReturnToService=2
MailProg=/bin/true
KillWait=5
MinJobAge=600
# CPUs as configured (config_overrides: more than the machine has, for several single-threaded ranks).
NodeName=$host CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$memory Feature=knl,gpu NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
    alive "$(pid_of munged)" && return 0
    munged --key-file="$ROOT/etc/munge.key" --socket="$SOCKET" --pid-file="$ROOT/run/munged.pid" \
        --log-file="$ROOT/log/munged.log" --seed-file="$ROOT/run/munged.seed" --force
    for _ in $(seq 50); do
        munge -S "$SOCKET" -n 2>/dev/null | unmunge -S "$SOCKET" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "munged did not come up (see $ROOT/log/munged.log)"
    exit 1
}

node_state() { SLURM_CONF=$CONF sinfo -h -N -o '%T' 2>/dev/null | head -n 1; }

up() {
    install_packages
    if alive "$(pid_of slurmctld)" && alive "$(pid_of slurmd)" && alive "$(pid_of munged)"; then
        echo "SLURM_CONF=$CONF"
        return 0
    fi
    write_config
    start_munge
    alive "$(pid_of slurmctld)" || slurmctld -c -f "$CONF"
    alive "$(pid_of slurmd)" || slurmd -f "$CONF"
    for _ in $(seq 300); do
        case "$(node_state)" in
            idle*|mixed*|allocated*) echo "SLURM_CONF=$CONF"; return 0 ;;
        esac
        sleep 0.1
    done
    log "the node did not become idle: $(node_state) (see $ROOT/log)"
    exit 1
}

status() {
    local ok=0 name pid
    for name in munged slurmctld slurmd; do
        pid=$(pid_of "$name")
        if alive "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: stopped"; ok=1; fi
    done
    [ "$ok" = 0 ] && echo "node: $(node_state)"
    return "$ok"
}

# Every process under PID (its children, theirs, ...), from /proc: the job steps a slurmd started.
descendants() {
    local parent=$1 entry pid ppid
    local -A children=()
    for entry in /proc/[0-9]*/stat; do
        read -r pid _ _ ppid _ < "$entry" 2>/dev/null || continue
        children[$ppid]+="$pid "
    done
    local queue=("$parent") found=() next
    while [ "${#queue[@]}" -gt 0 ]; do
        next=${queue[0]}
        queue=("${queue[@]:1}")
        for pid in ${children[$next]:-}; do
            found+=("$pid")
            queue+=("$pid")
        done
    done
    echo "${found[@]}"
}

cluster_steps() {
    local entry pid link found=()
    for entry in /proc/[0-9]*; do
        pid=${entry#/proc/}
        [ "$(cat "$entry/comm" 2>/dev/null)" = slurmstepd ] || continue
        for link in "$entry"/fd/*; do
            if [[ "$(readlink "$link" 2>/dev/null)" == "$ROOT"/* ]]; then
                found+=("$pid")
                read -r -a more <<<"$(descendants "$pid")"
                found+=("${more[@]}")
                break
            fi
        done
    done
    echo "${found[@]}"
}

stop_pids() {
    local pid
    for pid in "$@"; do
        if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    for _ in $(seq 100); do
        local left=0
        for pid in "$@"; do alive "$pid" && left=1; done
        [ "$left" = 0 ] && return 0
        sleep 0.1
    done
    for pid in "$@"; do
        if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
}

down() {
    local name pid steps=()
    [ -n "$ROOT" ] || return 0
    if alive "$(pid_of slurmctld)"; then
        # Cancel the jobs and let slurmd end their steps (their processes) before the daemons go.
        SLURM_CONF=$CONF scancel --quiet --user=root 2>/dev/null || true
        for _ in $(seq 300); do
            [ -z "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    # Job steps outlive a killed slurmd (proctrack/pgid), and slurmstepd is no child of slurmd (it forks
    # twice): this cluster's steps are the slurmstepd processes holding a file of its folder open
    # (slurmd.log), with everything under them.  Never a pattern over the host's processes.
    read -r -a steps <<<"$(cluster_steps)"
    for name in slurmd slurmctld munged; do
        pid=$(pid_of "$name")
        if alive "$pid"; then stop_pids "$pid"; fi
        rm -f "$ROOT/run/$name.pid"
    done
    if [ "${#steps[@]}" -gt 0 ]; then stop_pids "${steps[@]}"; fi
    if [ -z "${LOCAL_SLURM_DIR:-}" ] && [ -s "$STATE" ] && [ "$(cat "$STATE")" = "$ROOT" ]; then
        rm -f "$STATE"   # the folder stays (logs); a later `up` makes a new one
    fi
}

case "${1:-}" in
    up) resolve_root 1; up ;;
    down) resolve_root 0; down ;;
    status) resolve_root 0; if [ -z "$ROOT" ]; then echo "no cluster (nothing recorded in $STATE)"; exit 1; fi; status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
