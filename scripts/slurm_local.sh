#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for the tests and for trying the course's Slurm
# paths (scripts/cluster.sbatch, `scripts/grade.py autograde A --executor slurm`) without a cluster.
#
#   scripts/slurm_local.sh start   [DIR]   # munged, slurmctld, slurmd; waits until the node is idle
#   scripts/slurm_local.sh env     [DIR]   # prints `export SLURM_CONF=...`: eval it, then sbatch ...
#   scripts/slurm_local.sh status  [DIR]   # each daemon's pid and the node's state
#   scripts/slurm_local.sh stop    [DIR]   # cancels its jobs, stops every daemon it started
#   scripts/slurm_local.sh install         # apt-get install slurm-wlm (as .ci/run does)
#
# SLURM_LOCAL_CPUS sets the node's CPUs (default: this machine's; more lets sleeping tasks share).
# Everything lives in DIR (default $SLURM_LOCAL_DIR, else /tmp/dtp-slurm-$UID): slurm.conf, a munge
# key of its own, state, spool, pid files and logs. Nothing of the machine's own Slurm or munge is
# read or changed (/etc/slurm, /etc/munge, /run/munge stay as they are): the daemons listen on free
# ports and a munge socket in DIR, and the client commands find the cluster through SLURM_CONF.
# `stop` ends only what `start` started: the pids in DIR's pid files, and any process that still
# carries this cluster's marker in its environment (the job steps' slurmstepd).
#
# Exit status: 0 done; 1 failed (the daemon logs' tails are printed); 3 (start) Slurm cannot run
# here, with the reason on stderr (not root, slurm-wlm missing): the tests skip on it.
# Slurm 22.05 (Debian 12's slurm-wlm) runs one slurmd per host: one node. Facts found by trying:
# /work/shared/notes/slurm-on-one-machine.md.
set -euo pipefail

cmd=${1:-}
DIR=${2:-${SLURM_LOCAL_DIR:-/tmp/dtp-slurm-$(id -u)}}
CANNOT=3

usage() {
    echo "usage: $0 start|stop|status|env [DIR] | install" >&2
    exit 2
}

cannot() {  # Slurm cannot run here: say why, exit 3
    echo "slurm_local: cannot start a local Slurm: $*" >&2
    exit $CANNOT
}

conf() { echo "$DIR/slurm.conf"; }

# is pid $1 alive and one of ours (started by this script: its environment carries the marker)?
ours() {
    local pid=$1
    { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "DTP_SLURM_LOCAL=$DIR"
}

# the pids of every live process that carries this cluster's marker (daemons, slurmstepd)
marked_pids() {
    local p
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" != "$$" ] && ours "$p" && echo "$p"
    done
    return 0
}

stop_pid() {  # TERM, then KILL after 10 s; only a pid that is ours
    local pid=$1 name=$2 i
    ours "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 100); do
        ours "$pid" || { echo "slurm_local: stopped $name (pid $pid)"; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    echo "slurm_local: killed $name (pid $pid): it ignored TERM for 10 s"
}

free_port() {
    python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
EOF
}

logs_tail() {
    local f
    for f in "$DIR"/log/*.log; do
        [ -f "$f" ] || continue
        echo "--- $f (last 15 lines)" >&2
        tail -n 15 "$f" >&2
    done
}

start() {
    [ "$(id -u)" = 0 ] || cannot "it needs root (slurmd starts job steps as their user; SlurmUser=root)"
    local missing="" tool
    for tool in munged slurmctld slurmd sbatch squeue scontrol sinfo scancel python3; do
        command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
    done
    [ -z "$missing" ] || cannot "missing$missing (Debian/Ubuntu: apt-get install slurm-wlm, or $0 install)"
    if [ -f "$DIR/slurmctld.pid" ] && ours "$(cat "$DIR/slurmctld.pid")"; then
        echo "slurm_local: already running in $DIR (stop it first)" >&2
        exit 1
    fi
    mkdir -p "$DIR"/{munge,state,spool,log}
    chmod 700 "$DIR" "$DIR/munge"
    rm -f "$DIR"/*.pid "$DIR"/munge/munge.socket.2*
    local host cpus mem ctld_port slurmd_port
    host=$(hostname -s)
    cpus=${SLURM_LOCAL_CPUS:-$(nproc)}  # (more than the machine has: tasks share its cores)
    # 90 % of the machine's memory, in MB (Slurm refuses a node that has less than it claims)
    mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    ctld_port=$(free_port)
    slurmd_port=$(free_port)
    [ -f "$DIR/munge/munge.key" ] || {
        head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
        chmod 600 "$DIR/munge/munge.key"
    }
    cat >"$(conf)" <<EOF
# one-node Slurm written by scripts/slurm_local.sh (everything under $DIR)
ClusterName=dtp-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket.2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# the node is as this file says (SLURM_LOCAL_CPUS may declare more CPUs than the machine has)
SlurmdParameters=config_overrides
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
PlugStackConfig=$DIR/plugstack.conf
# finished jobs stay visible to scontrol for 10 minutes; a time limit or a cancel kills in 5 s
MinJobAge=600
KillWait=5
InactiveLimit=0
# a job array of a whole class (one task per submission)
MaxArraySize=100001
MaxJobCount=200000
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    : >"$DIR/plugstack.conf"  # (the machine's /etc/slurm/plugstack.conf is not ours)
    export SLURM_CONF
    SLURM_CONF=$(conf)
    # every daemon carries DTP_SLURM_LOCAL in its environment, and so do the slurmstepd it starts
    # (this script's own processes do not: stop finds only the cluster's)
    local mark="DTP_SLURM_LOCAL=$DIR"
    env "$mark" munged --force --socket="$DIR/munge/munge.socket.2" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" || { logs_tail; stop; exit 1; }
    env "$mark" slurmctld -f "$(conf)" -i || { logs_tail; stop; exit 1; }
    env "$mark" slurmd -f "$(conf)" -N "$host" || { logs_tail; stop; exit 1; }
    local i state=""
    for i in $(seq 150); do  # 30 s
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
        case "$state" in idle*|mixed*|allocated*) break ;; esac
        sleep 0.2
    done
    case "$state" in
        idle*|mixed*|allocated*) ;;
        *) echo "slurm_local: the node did not come up in 30 s (state: '${state:-none}')" >&2
           logs_tail; stop; exit 1 ;;
    esac
    echo "slurm_local: one node ($host, $cpus CPUs) idle; export SLURM_CONF=$(conf)"
}

stop() {
    local i pids
    if [ -f "$(conf)" ] && [ -f "$DIR/slurmctld.pid" ] && ours "$(cat "$DIR/slurmctld.pid")"; then
        # its jobs first (a step outlives slurmd otherwise), bounded
        SLURM_CONF=$(conf) scancel --quiet --full --partition=main 2>/dev/null || true
        for i in $(seq 100); do  # 20 s
            [ -z "$(SLURM_CONF=$(conf) squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    for name in slurmd slurmctld munged; do
        if [ -f "$DIR/$name.pid" ]; then
            stop_pid "$(cat "$DIR/$name.pid")" "$name"
            rm -f "$DIR/$name.pid"
        fi
    done
    for pid in $(marked_pids); do  # a job step's slurmstepd still alive, or a pid file lost
        stop_pid "$pid" "$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | cut -c1-60)"
    done
    pids=$(marked_pids)
    if [ -n "$pids" ]; then
        echo "slurm_local: still running after stop: $pids" >&2
        exit 1
    fi
}

status() {
    local name pid
    for name in munged slurmctld slurmd; do
        pid=$(cat "$DIR/$name.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && ours "$pid"; then echo "$name: running (pid $pid)"
        else echo "$name: not running"; fi
    done
    if [ -f "$(conf)" ]; then
        SLURM_CONF=$(conf) sinfo -h -o "node %n: %T, %c CPUs" 2>/dev/null || echo "node: no answer"
    fi
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$(conf)" ;;
    install)
        command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 && exit 0
        command -v apt-get >/dev/null 2>&1 || cannot "no apt-get to install slurm-wlm with"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm ;;
    *) usage ;;
esac
