#!/usr/bin/env bash
# A SLURM cluster with munge, started by hand (no systemd), everything under one folder: one node on this
# machine's own addresses, or a virtual cluster of several nodes, each a network namespace (its own
# hostname, address, /dev/shm and node-local scratch folder) joined to a bridge, each with its own slurmd.
# For the tests that run the shipped slurm/*.sbatch scripts for real (tests/test_slurm_cluster.py,
# tests/test_multinode.py).
#
#   scripts/local_slurm.sh up [--nodes N]  # install the Debian packages if missing, start munged, slurmctld and
#                                   # the slurmd(s); wait for the nodes to be idle; print SLURM_CONF=<path>
#                                   # (and, with several nodes, SCRATCH=<the node-local folder's path>).
#                                   # On a running cluster: restarts a node that was killed, else returns.
#   scripts/local_slurm.sh status   # the daemons and each node's state; exit 0 when all are up
#   scripts/local_slurm.sh down     # stop the daemons and the job steps they started, by pid; remove every
#                                   # namespace, link and control group the cluster made, by the names it recorded
#   scripts/local_slurm.sh exec nodeK CMD...  # run CMD on node K (its network, hostname and mounts)
#   scripts/local_slurm.sh kill nodeK        # node K crashes: its link goes down, then every process on it is
#                                   # SIGKILLed (peers see silence, not a closed connection); `up` restarts it
#   scripts/local_slurm.sh limit [--cpu-percent P|off] [--link-rate RATE|off]
#                                   # on a running cluster of several nodes: each node's CPU quota (cgroup v1,
#                                   # P % of one core, for every process on it, its jobs included) and the rate
#                                   # of its link, both directions (tc htb on both ends, RATE as tc writes it:
#                                   # 40mbit, 1gbit); kept for a node that `up` restarts; `status` shows them
#
# Environment: LOCAL_SLURM_DIR (the cluster's folder: created if absent; an existing one must be a real
# folder owned by this user that nobody else can write to), LOCAL_SLURM_CPUS (CPUs each node advertises,
# default 4 on one node, 2 on several: config_overrides lets single-threaded ranks share the 2 cores),
# LOCAL_SLURM_PORT (slurmctld's port; slurmd's is the next one), LOCAL_SLURM_SUBNET (several nodes: the first
# three parts of the private /24 the cluster's bridge gets, default 10.251.0: node K is .K, slurmctld .254;
# refused when this machine already routes it), LOCAL_SLURM_NODE_CPU_PERCENT (several nodes: each node's
# processes limited to this share of one core by a cgroup v1 cpu quota; unset: no limit),
# LOCAL_SLURM_SLURMD_TIMEOUT (several nodes: seconds of silence before slurmctld marks a node DOWN, default 20).
# Without LOCAL_SLURM_DIR, `up` makes a new folder with mktemp -d and records its path in $LOCAL_SLURM_STATE
# (default ~/.local/state/hpc-dl-suite/local-slurm-dir), where status and down find it; nothing goes through a
# predictable path in a world-writable folder.  Needs root (SlurmUser=root; namespaces) and, to install
# packages, apt-get.  Idempotent: `up` on a running cluster returns at once; `down` on a stopped one does
# nothing.
set -euo pipefail

STATE=${LOCAL_SLURM_STATE:-${HOME:-/root}/.local/state/hpc-dl-suite/local-slurm-dir}
PACKAGES=(slurmctld slurmd slurm-client munge openmpi-bin libopenmpi-dev iproute2)   # iproute2: ip, for --nodes

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
    command -v ip >/dev/null || missing+=(x)
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
    local host memory address nodes node_lines extra auth k
    host=$(hostname -s)
    memory=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n 1)
    auth="AuthInfo=socket=$SOCKET"
    if [ "$NODES" = 1 ]; then
        memory=$(( memory * 9 / 10 ))
        address=127.0.0.1
        nodes=$host
        # CPUs as configured (config_overrides: more than the machine has, for several single-threaded ranks).
        node_lines="NodeName=$host CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$memory Feature=knl,gpu NodeAddr=127.0.0.1 State=UNKNOWN"
        extra="SlurmdSpoolDir=$ROOT/spool
SlurmdPidFile=$ROOT/run/slurmd.pid
SlurmdLogFile=$ROOT/log/slurmd.log
ReturnToService=2"
    else
        memory=$(( memory * 9 / 10 / NODES ))
        address=$SUBNET.254
        nodes="node[1-$NODES]"
        node_lines=
        for k in $(seq "$NODES"); do
            node_lines+="NodeName=node$k CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$memory Feature=knl,gpu NodeAddr=$SUBNET.$k State=UNKNOWN"$'\n'
        done
        node_lines=${node_lines%$'\n'}
        # Each slurmd its own spool, pid and log files (%n: the node's name).  A node silent for
        # SlurmdTimeout is marked DOWN; it returns when `up` restarts it and it registers again
        # (ReturnToService=2).  A requeued job may start cred_expire + 1 s after it ended.
        extra="SlurmdSpoolDir=$ROOT/spool/%n
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmdTimeout=$SLURMD_TIMEOUT
ReturnToService=2
SchedulerParameters=sched_interval=5"
        auth="$auth,cred_expire=10"
    fi
    write_file "$CONF" <<EOF
# Written by scripts/local_slurm.sh: a test cluster of $NODES node(s).
ClusterName=hpcdl
SlurmctldHost=$host($address)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
$auth
CredType=cred/munge
StateSaveLocation=$ROOT/state
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
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
MailProg=/bin/true
KillWait=5
MinJobAge=600
$extra
$node_lines
PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
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
    if [ "$NODES" != 1 ]; then
        down_nodes
    else
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
    fi
    if [ -z "${LOCAL_SLURM_DIR:-}" ] && [ -s "$STATE" ] && [ "$(cat "$STATE")" = "$ROOT" ]; then
        rm -f "$STATE"   # the folder stays (logs); a later `up` makes a new one
    fi
}

# --- Several nodes: network namespaces on a bridge -----------------------------------------------------
# Names are derived from the cluster's folder (two clusters never share one) and recorded in
# $ROOT/run/made as they are made; `down` removes what is recorded there, nothing found by a pattern.

network_names() {
    TAG=$(printf '%s' "$ROOT" | sha256sum | cut -c1-6)
    BRIDGE=hd${TAG}br
    CGROUP=/sys/fs/cgroup/cpu/hpcdl-$TAG
}
netns_of() { echo "hpcdl-$TAG-$1"; }
veth_of() { echo "hd${TAG}n${1#node}"; }   # the bridge's end of node K's link (15 characters at most)
NODE_IF=hpcdl0                             # node K's end, named alike on every node (HOROVOD_GLOO_IFACE)

record() { echo "$1 $2" >> "$ROOT/run/made"; }
recorded() { if [ -s "$ROOT/run/made" ]; then sed -n "s/^$1 //p" "$ROOT/run/made"; fi; }

holder_of() { pid_of "$1.holder"; }

check_subnet() {
    if ! [[ "$SUBNET" =~ ^10\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || (( BASH_REMATCH[1] > 255 || BASH_REMATCH[2] > 255 )); then
        log "LOCAL_SLURM_SUBNET=$SUBNET: expected the first three parts of a private 10.x.y.0/24 network (e.g. 10.251.0)"
        exit 2
    fi
    if ip link show "$BRIDGE" >/dev/null 2>&1; then return 0; fi   # ours, from an earlier `up`
    if [ -n "$(ip -4 route show to match "$SUBNET.1")" ] && ip -4 route show to match "$SUBNET.1" | grep -qv '^default'; then
        log "$SUBNET.0/24 is already routed on this machine ($(ip -4 route show to match "$SUBNET.1" | grep -v '^default' | head -n 1)); choose another LOCAL_SLURM_SUBNET"
        exit 2
    fi
}

make_bridge() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        # A fixed address: by default a bridge takes its lowest port's, and changes it when that link goes
        # down (a killed node), which leaves the other nodes' ARP entries for slurmctld stale.
        ip link add "$BRIDGE" address "02:${TAG:0:2}:${TAG:2:2}:${TAG:4:2}:00:fe" type bridge
        record bridge "$BRIDGE"
        ip addr add "$SUBNET.254/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
}

# Node K's namespaces and the processes holding them: a network namespace with its link to the bridge,
# and inside it a process with its own hostname and mount namespace (the node's scratch and TmpFS
# folders, /etc/hosts, a private /dev/shm, and the other nodes' folders out of sight).
start_node() {
    local node=$1 k=${1#node} ns veth holder
    ns=$(netns_of "$node")
    veth=$(veth_of "$node")
    if ! ip netns list | grep -qx "$ns\( (id: [0-9]*)\)\?"; then
        ip netns add "$ns"
        record netns "$ns"
    fi
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name "$NODE_IF" netns "$ns"
        record veth "$veth"
        ip link set "$veth" master "$BRIDGE"
        ip -n "$ns" addr add "$SUBNET.$k/24" dev "$NODE_IF"
    fi
    ip link set "$veth" up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$NODE_IF" up
    mkdir -p "$ROOT/nodes/$node/scratch" "$ROOT/nodes/$node/tmp" "$ROOT/spool/$node"
    rm -f "$ROOT/run/$node.holder.pid"
    # nsenter, not `ip netns exec`: that one remounts /sys, hiding the cgroup folders slurmd looks for.
    setsid nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private --fork \
        bash "$ROOT/etc/node.sh" "$node" "$ROOT" </dev/null >>"$ROOT/log/$node.log" 2>&1 &
    for _ in $(seq 100); do
        holder=$(holder_of "$node")
        alive "$holder" && break
        sleep 0.1
    done
    if ! alive "$holder"; then
        log "$node did not start (see $ROOT/log/$node.log)"
        exit 1
    fi
    local percent=$CPU_PERCENT
    if [ -s "$ROOT/run/cpu_percent" ]; then percent=$(cat "$ROOT/run/cpu_percent"); fi   # set by `limit`
    # In the quota before slurmd starts: slurmd and the jobs it starts inherit it.
    if [ -n "$percent" ]; then set_cpu_quota "$node" "$percent"; fi
    # Limits set by `limit` on this running cluster hold for a restarted node too.
    if [ -s "$ROOT/run/link_rate" ]; then set_link_rate "$node" "$(cat "$ROOT/run/link_rate")"; fi
    if ! on_node "$node" slurmd -N "$node" -f "$CONF"; then
        log "slurmd of $node did not start (see $ROOT/log/slurmd-$node.log)"
        exit 1
    fi
    if [ -n "$percent" ]; then   # slurmd daemonises from on_node's process, outside the holder: moved in too
        local slurmd_pid
        for _ in $(seq 50); do slurmd_pid=$(pid_of "slurmd-$node"); alive "$slurmd_pid" && break; sleep 0.1; done
        if alive "$slurmd_pid"; then echo "$slurmd_pid" > "$CGROUP/$node/cgroup.procs"; fi
    fi
}

write_node_script() {
    local host k
    host=$(hostname -s)
    {
        echo "127.0.0.1 localhost"
        echo "$SUBNET.254 $host"
        for k in $(seq "$NODES"); do echo "$SUBNET.$k node$k"; done
    } | write_file "$ROOT/etc/hosts"
    mkdir -p "$ROOT/scratch" "$ROOT/nodes"
    write_file "$ROOT/etc/node.sh" <<'EOF'
# A node of scripts/local_slurm.sh (run by it inside the node's new namespaces; $1 node, $2 cluster folder).
set -eu
node=$1 root=$2
hostname "$node"
mount --bind "$root/nodes/$node/scratch" "$root/scratch"
mount --bind "$root/nodes/$node/tmp" "$root/tmp"
mount --bind "$root/etc/hosts" /etc/hosts
mount -t tmpfs -o size=2g,mode=1777 "shm-$node" /dev/shm
mount -t tmpfs -o size=1m,mode=755,ro "nodes-$node" "$root/nodes"
echo "$$" > "$root/run/$node.holder.pid"
exec sleep infinity
EOF
}

# CMD on node NODE (its network, hostname and mounts), as a child of the caller.
on_node() {
    local node=$1 holder
    shift
    holder=$(holder_of "$node")
    if ! alive "$holder"; then
        log "$node is down (not started, or killed): \`$0 up\` restarts it"
        exit 1
    fi
    nsenter --target "$holder" --net --uts --mount -- "$@"
}

node_pids() { ip netns pids "$(netns_of "$1")" 2>/dev/null || true; }

kill_node() {
    local node=$1 pids
    if ! recorded netns | grep -qx "$(netns_of "$node")"; then log "$node: no such node"; exit 2; fi
    ip link set "$(veth_of "$node")" down 2>/dev/null || true   # first: the others see silence, not a reset
    read -r -a pids <<<"$(node_pids "$node" | tr '\n' ' ')"
    if [ "${#pids[@]}" -gt 0 ]; then kill -KILL "${pids[@]}" 2>/dev/null || true; fi
    for _ in $(seq 100); do
        local left=0 pid
        for pid in $(node_pids "$node"); do alive "$pid" && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.1
    done
    rm -f "$ROOT/run/$node.holder.pid"
    log "$node killed (${#pids[@]} processes, link down)"
}

nodes_state() { SLURM_CONF=$CONF sinfo -h -N -o '%N %T' 2>/dev/null; }

up_nodes() {
    check_subnet
    if ! alive "$(pid_of slurmctld)"; then   # a running cluster keeps its settings
        write_config
        write_node_script
    fi
    start_munge
    make_bridge
    alive "$(pid_of slurmctld)" || slurmctld -c -f "$CONF"
    local k started=()
    for k in $(seq "$NODES"); do
        if ! alive "$(holder_of "node$k")" || ! alive "$(pid_of "slurmd-node$k")"; then
            if alive "$(holder_of "node$k")"; then kill_node "node$k" 2>/dev/null; fi
            start_node "node$k"
            started+=("node$k")
        fi
    done
    for _ in $(seq 300); do
        local ready=0
        for k in $(seq "$NODES"); do
            case "$(nodes_state | awk -v n="node$k" '$1 == n {print $2}')" in
                idle*|mixed*|allocated*) ready=$((ready + 1)) ;;
                down*) for node in "${started[@]}"; do   # killed earlier, back now: return it to service
                           if [ "$node" = "node$k" ]; then
                               SLURM_CONF=$CONF scontrol update NodeName="node$k" State=RESUME 2>/dev/null || true
                           fi
                       done ;;
            esac
        done
        if [ "$ready" = "$NODES" ]; then
            echo "SLURM_CONF=$CONF"
            echo "SCRATCH=$ROOT/scratch"
            return 0
        fi
        sleep 0.2
    done
    log "the nodes did not become idle: $(nodes_state | tr '\n' ' ') (see $ROOT/log)"
    exit 1
}

# Node K's CPU quota (P % of one core, -1: none) for every process in its namespace, and the processes
# started there later (they inherit it).  A 10 ms period: a process over its share waits a few ms, not the
# tens of ms a 100 ms period would stop it for (steps and messages of tens of ms would jitter by that much).
set_cpu_quota() {
    local node=$1 percent=$2 pid
    if [ ! -d "$CGROUP" ]; then
        mkdir "$CGROUP"
        record cgroup "$CGROUP"
    fi
    mkdir -p "$CGROUP/$node"
    echo 10000 > "$CGROUP/$node/cpu.cfs_period_us"
    if [ "$percent" = off ]; then echo -1; else echo $(( percent * 100 )); fi > "$CGROUP/$node/cpu.cfs_quota_us"
    for pid in $(ip netns pids "$(netns_of "$node")" 2>/dev/null); do
        echo "$pid" > "$CGROUP/$node/cgroup.procs" 2>/dev/null || true   # one that just ended
    done
}

# Node K's link at RATE in both directions, on the bridge's end (traffic to the node) and on the node's end
# (traffic from it): an htb class of RATE whose data waits in a byte FIFO of 400 ms at RATE (bursts queue, not
# drop), and within the same RATE a class served first for packets under 128 bytes (TCP acknowledgements,
# small control messages).  With one FIFO (a tbf) the acknowledgements of one direction of a TCP connection
# waited up to 400 ms behind the other direction's data: senders resent and probed for loss, and a 2-rank
# allreduce of 0.5 MB at 10mbit took 0.42-0.63 s (wire time 0.40 s); with them served first, 0.39-0.47 s
# (#27, docs/clusters.md).  `off` removes both.
shape_link() {
    local rate=$1 ns=$2 dev=$3 bytes_per_s queue_bytes   # ns: the device's network namespace, or '' for the host's
    local -a in_ns=()
    if [ -n "$ns" ]; then in_ns=(-n "$ns"); fi
    # The link's bytes per second, from RATE as tc writes it; the small packets' share is a tenth of the rate
    # (they may borrow the rest first), the data's nine tenths (it borrows what they leave).
    read -r bytes_per_s queue_bytes <<<"$(awk -v r="$rate" 'BEGIN {
        n = r + 0; u = substr(r, length(n "") + 1)
        scale["bit"] = 1 / 8; scale["kbit"] = 1e3 / 8; scale["mbit"] = 1e6 / 8; scale["gbit"] = 1e9 / 8
        scale["bps"] = 1; scale["kbps"] = 1e3; scale["mbps"] = 1e6; scale["gbps"] = 1e9
        b = n * scale[u]; q = int(b * 0.4); if (q < 16384) q = 16384; printf "%d %d\n", b, q }')"
    tc "${in_ns[@]}" qdisc add dev "$dev" root handle 1: htb default 20
    tc "${in_ns[@]}" class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" burst 4k cburst 4k
    tc "${in_ns[@]}" class add dev "$dev" parent 1:1 classid 1:10 htb rate "$((bytes_per_s / 10))bps" \
        ceil "$rate" burst 4k cburst 4k prio 0
    tc "${in_ns[@]}" class add dev "$dev" parent 1:1 classid 1:20 htb rate "$((bytes_per_s - bytes_per_s / 10))bps" \
        ceil "$rate" burst 4k cburst 4k prio 1
    tc "${in_ns[@]}" qdisc add dev "$dev" parent 1:20 handle 20: bfifo limit "$queue_bytes"
    # IPv4 packets of a total length under 128 bytes: to the first class.
    tc "${in_ns[@]}" filter add dev "$dev" parent 1: protocol ip prio 1 u32 match u16 0x0000 0xff80 at 2 flowid 1:10
}

set_link_rate() {
    local node=$1 rate=$2 ns veth
    ns=$(netns_of "$node")
    veth=$(veth_of "$node")
    tc qdisc del dev "$veth" root 2>/dev/null || true
    tc -n "$ns" qdisc del dev "$NODE_IF" root 2>/dev/null || true
    if [ "$rate" != off ]; then
        shape_link "$rate" '' "$veth"
        shape_link "$rate" "$ns" "$NODE_IF"
    fi
}

limit_nodes() {
    local cpu='' rate='' k
    while [ $# -gt 0 ]; do
        case "$1" in
            --cpu-percent) cpu=${2:-}; shift 2 || true ;;
            --link-rate) rate=${2:-}; shift 2 || true ;;
            *) log "limit: unknown option $1 (expected --cpu-percent P|off, --link-rate RATE|off)"; exit 2 ;;
        esac
    done
    if [ -n "$cpu" ] && [ "$cpu" != off ] && ! [[ "$cpu" =~ ^[1-9][0-9]{0,2}$ ]]; then
        log "limit --cpu-percent $cpu: expected a whole percentage of one core (1-999) or off"
        exit 2
    fi
    if [ -n "$rate" ] && [ "$rate" != off ] && ! [[ "$rate" =~ ^[1-9][0-9]*(\.[0-9]+)?[kmg]?(bit|bps)$ ]]; then
        log "limit --link-rate $rate: expected a rate as tc writes it (40mbit, 1gbit, 500kbit) or off"
        exit 2
    fi
    if [ -z "$cpu$rate" ]; then log "limit: nothing to set (--cpu-percent P|off, --link-rate RATE|off)"; exit 2; fi
    for k in $(seq "$NODES"); do
        if [ -n "$cpu" ]; then set_cpu_quota "node$k" "$cpu"; fi
        if [ -n "$rate" ]; then set_link_rate "node$k" "$rate"; fi
    done
    if [ -n "$cpu" ]; then echo "$cpu" | write_file "$ROOT/run/cpu_percent"; fi
    if [ -n "$rate" ]; then echo "$rate" | write_file "$ROOT/run/link_rate"; fi
    echo "cpu per node: $(limits_cpu), link rate per node: $(limits_rate)"
}

limits_cpu() { local v; v=$(cat "$ROOT/run/cpu_percent" 2>/dev/null || true); if [ -n "$v" ] && [ "$v" != off ]; then echo "$v% of one core"; else echo "no limit"; fi; }
limits_rate() { local v; v=$(cat "$ROOT/run/link_rate" 2>/dev/null || true); if [ -n "$v" ] && [ "$v" != off ]; then echo "$v"; else echo "no limit"; fi; }

status_nodes() {
    local ok=0 name pid k state
    for name in munged slurmctld; do
        pid=$(pid_of "$name")
        if alive "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: stopped"; ok=1; fi
    done
    for k in $(seq "$NODES"); do
        state=$(nodes_state | awk -v n="node$k" '$1 == n {print $2}')
        if alive "$(holder_of "node$k")" && alive "$(pid_of "slurmd-node$k")"; then
            echo "node$k: $SUBNET.$k up, slurmd pid $(pid_of "slurmd-node$k"), ${state:-unknown}"
        else
            echo "node$k: $SUBNET.$k down, ${state:-unknown}"
            ok=1
        fi
    done
    echo "limits: cpu per node $(limits_cpu), link rate per node $(limits_rate)"
    return "$ok"
}

down_nodes() {
    local k pid pids name ns
    pid=$(pid_of slurmctld)
    if alive "$pid"; then stop_pids "$pid"; fi
    rm -f "$ROOT/run/slurmctld.pid"
    # Every process on a node is in its network namespace: slurmd, job steps, ranks, the holder.
    for ns in $(recorded netns); do
        read -r -a pids <<<"$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
        if [ "${#pids[@]}" -gt 0 ]; then stop_pids "${pids[@]}"; fi
    done
    pid=$(pid_of munged)
    if alive "$pid"; then stop_pids "$pid"; fi
    rm -f "$ROOT/run/munged.pid" "$ROOT"/run/node*.holder.pid "$ROOT"/run/slurmd-node*.pid
    for name in $(recorded veth); do ip link del "$name" 2>/dev/null || true; done
    for ns in $(recorded netns); do ip netns del "$ns" 2>/dev/null || true; done
    for name in $(recorded bridge); do ip link del "$name" 2>/dev/null || true; done
    for name in $(recorded cgroup); do
        for k in "$name"/node*; do
            if [ -d "$k" ]; then rmdir "$k" 2>/dev/null || true; fi
        done
        rmdir "$name" 2>/dev/null || true
    done
    rm -f "$ROOT/run/made" "$ROOT/run/nodes" "$ROOT/run/cpu_percent" "$ROOT/run/link_rate"
}

# NODES: the recorded size of the cluster in ROOT (1 when none is recorded); `up --nodes N` sets it.
read_settings() {
    NODES=1
    if [ -n "$ROOT" ] && [ -s "$ROOT/run/nodes" ]; then NODES=$(cat "$ROOT/run/nodes"); fi
    CPUS=${LOCAL_SLURM_CPUS:-$([ "$NODES" = 1 ] && echo 4 || echo 2)}
    SUBNET=${LOCAL_SLURM_SUBNET:-10.251.0}
    if [ -n "$ROOT" ] && [ -s "$ROOT/run/subnet" ]; then SUBNET=$(cat "$ROOT/run/subnet"); fi
    CPU_PERCENT=${LOCAL_SLURM_NODE_CPU_PERCENT:-}
    SLURMD_TIMEOUT=${LOCAL_SLURM_SLURMD_TIMEOUT:-20}
    if [ -n "$CPU_PERCENT" ] && ! [[ "$CPU_PERCENT" =~ ^[1-9][0-9]{0,2}$ ]]; then
        log "LOCAL_SLURM_NODE_CPU_PERCENT=$CPU_PERCENT: expected a whole percentage of one core (1-999)"
        exit 2
    fi
    [ -n "$ROOT" ] && network_names
    return 0
}

need_nodes() {
    if [ -z "$ROOT" ] || [ "$NODES" = 1 ]; then
        log "no cluster of several nodes is running (\`$0 up --nodes N\` starts one)"
        exit 2
    fi
    if ! [[ "${1:-}" =~ ^node[1-9][0-9]*$ ]] || (( ${1#node} > NODES )); then
        log "${1:-}: expected node1..node$NODES"
        exit 2
    fi
}

command=${1:-}
shift || true
case "$command" in
    up)
        wanted=1
        if [ "${1:-}" = --nodes ]; then
            [[ "${2:-}" =~ ^[1-9][0-9]?$ ]] || { echo "usage: $0 up [--nodes N] (N from 1 to 99)" >&2; exit 2; }
            wanted=$2
        fi
        install_packages
        resolve_root 1
        read_settings
        if alive "$(pid_of slurmctld)" && [ "$NODES" != "$wanted" ]; then
            log "a cluster of $NODES node(s) runs in $ROOT: \`$0 down\` first"
            exit 2
        fi
        NODES=$wanted
        CPUS=${LOCAL_SLURM_CPUS:-$([ "$NODES" = 1 ] && echo 4 || echo 2)}
        mkdir -p "$ROOT/run"
        if [ "$NODES" = 1 ]; then
            up
        else
            if [ "$(id -u)" != 0 ]; then log "several nodes need root (network namespaces)"; exit 3; fi
            echo "$NODES" | write_file "$ROOT/run/nodes"
            echo "$SUBNET" | write_file "$ROOT/run/subnet"
            up_nodes
        fi ;;
    down) resolve_root 0; read_settings; down ;;
    status)
        resolve_root 0
        if [ -z "$ROOT" ]; then echo "no cluster (nothing recorded in $STATE)"; exit 1; fi
        read_settings
        if [ "$NODES" = 1 ]; then status; else status_nodes; fi ;;
    exec)
        resolve_root 0; read_settings; need_nodes "${1:-}"; node=$1; shift
        # Under the node's CPU quota, as its jobs are (when the cluster was started with one).
        if [ -d "$CGROUP/$node" ]; then echo "$$" > "$CGROUP/$node/cgroup.procs"; fi
        on_node "$node" "$@" ;;
    kill) resolve_root 0; read_settings; need_nodes "${1:-}"; kill_node "$1" ;;
    limit) resolve_root 0; read_settings; need_nodes node1; limit_nodes "$@" ;;
    *) echo "usage: $0 up [--nodes N] | status | down | exec nodeK CMD... | kill nodeK | limit [--cpu-percent P|off] [--link-rate RATE|off]" >&2; exit 2 ;;
esac
