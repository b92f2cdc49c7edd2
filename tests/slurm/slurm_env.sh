#!/usr/bin/env bash
# A single-node Slurm on this machine, for the `slurm` test tier and for
# trying `circuitlab-server --executor slurm` without a cluster.
#
#   eval "$(tests/slurm/slurm_env.sh start [DIR])"   # prints: export SLURM_CONF=DIR/slurm.conf
#   tests/slurm/slurm_env.sh stop [DIR]
#
# Installs Debian's slurm-wlm and munge if missing; writes DIR/slurm.conf
# (proctrack/linuxproc, task/none, no cgroups, jobcomp/filetxt so that
# `sacct -c` works without slurmdbd; this machine's CPUs as one node, the
# partition "debug"); starts munged, slurmctld and slurmd as root and waits
# for the node to be idle. `stop` kills them by their pid files. DIR
# defaults to /tmp/circuitlab-slurm. Needs root.
set -euo pipefail
cmd=${1:-}
dir=${2:-/tmp/circuitlab-slurm}
say() { echo "slurm-env: $*" >&2; }

stop() {
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

case $cmd in
  start)
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
      say "installing slurm-wlm and munge"
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null
    fi
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    chmod 755 "$dir"
    chown munge: "$dir/munge"
    [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null;
                                     chown munge: /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    mem=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024 ))
    cat >"$dir/slurm.conf" <<CONF
ClusterName=circuitlab
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
MpiDefault=none
ReturnToService=2
MinJobAge=300
NodeName=localhost CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    stop
    runuser -u munge -- /usr/sbin/munged --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
      --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    [ -s "$dir/munge/munged.pid" ] || { say "munged did not start (can user munge reach $dir?)"; exit 1; }
    cp "$dir/munge/munged.pid" "$dir/munged.pid"
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF" -N localhost
    for _ in $(seq 100); do
      state=$(sinfo -h -N -o %T 2>/dev/null || true)
      [ "$state" = idle ] && break
      sleep 0.2
    done
    [ "$state" = idle ] || { say "the node did not become idle ($state)"; tail -5 "$dir/slurmctld.log" >&2; stop; exit 1; }
    say "single-node Slurm up ($(nproc) CPUs) in $dir"
    echo "export SLURM_CONF=$dir/slurm.conf"
    ;;
  stop) stop ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
