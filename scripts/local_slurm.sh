#!/usr/bin/env bash
# A one-node SLURM cluster with munge, started by hand (no systemd), everything under one folder.
# For the tests that run the shipped slurm/*.sbatch scripts for real (tests/test_slurm_cluster.py).
#
#   scripts/local_slurm.sh up       # install the Debian packages if missing, start munged, slurmctld, slurmd;
#                                   # wait for the node to be idle; print SLURM_CONF=<path>
#   scripts/local_slurm.sh status   # the daemons and the node state; exit 0 when all are up
#   scripts/local_slurm.sh down     # stop the daemons by pid (and any job step left behind)
#
# Environment: LOCAL_SLURM_DIR (default /tmp/hpc-dl-suite-slurm), LOCAL_SLURM_CPUS (CPUs the node
# advertises, default 4: config_overrides lets 4 single-threaded ranks share 2 cores).  Needs root
# (SlurmUser=root) and, to install packages, apt-get.  Idempotent: `up` on a running cluster returns at once.
set -euo pipefail

ROOT=${LOCAL_SLURM_DIR:-/tmp/hpc-dl-suite-slurm}
CPUS=${LOCAL_SLURM_CPUS:-4}
CONF=$ROOT/etc/slurm.conf
SOCKET=$ROOT/munge/munge.socket.2
PACKAGES=(slurmctld slurmd slurm-client munge openmpi-bin libopenmpi-dev)

log() { echo "local_slurm: $*" >&2; }

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
    cat > "$CONF" <<EOF
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

down() {
    local name pid
    if alive "$(pid_of slurmctld)"; then
        # Cancel the jobs and let slurmd end their steps (their processes) before the daemons go.
        SLURM_CONF=$CONF scancel --quiet --user=root 2>/dev/null || true
        for _ in $(seq 300); do
            [ -z "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    for name in slurmd slurmctld munged; do
        pid=$(pid_of "$name")
        if alive "$pid"; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
            if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
        fi
        rm -f "$ROOT/run/$name.pid"
    done
    # Job steps outlive a killed slurmd (proctrack/pgid): end whatever the cluster's jobs started.
    pkill -f "slurmstepd: \[" 2>/dev/null || true
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
