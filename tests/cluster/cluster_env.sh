#!/usr/bin/env bash
# A Slurm cluster of separate hosts on this one machine, for the `cluster`
# tier (issue 49) and for trying `--executor slurm` across a network.
#
#   tests/cluster/cluster_env.sh start DIR     # prints `export ...` lines; eval them
#   tests/cluster/cluster_env.sh on HOST CMD...  # run CMD on HOST (DIR from $CLUSTER_DIR)
#   tests/cluster/cluster_env.sh kill HOST     # a crash: HOST's link down, then SIGKILL everything on it
#   tests/cluster/cluster_env.sh boot HOST     # link up, HOST's munged (+ slurmd on a node) started again
#   tests/cluster/cluster_env.sh stop DIR
#
# Every host is a network namespace of its own (address 10.231.0.x on one
# bridge, no route anywhere else) with its own munged (the cluster's shared
# key, as real clusters have) and its own mounts:
#   ctl  10.231.0.2   slurmctld; the login host users run the CLI from
#   srv  10.231.0.3   the circuitlab server (a Slurm submit host)
#   n1   10.231.0.11  slurmd, 2 CPUs, 2 GPUs on paper (gres.conf of plain files)
#   n2   10.231.0.12  slurmd, 2 CPUs
#   n3   10.231.0.13  slurmd, 1 CPU
# DIR/srv (the server's data) is hidden from every other host behind an
# empty tmpfs; DIR/shared (binaries' logs, the workers' token and CA) is the
# cluster's shared filesystem. Needs root; installs slurm-wlm and munge if
# missing. Processes are found again by namespace (`ip netns pids`), so
# `stop` leaves nothing behind.
set -euo pipefail
exec=
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
say() { echo "cluster-env: $*" >&2; }
hosts=(ctl srv n1 n2 n3)
declare -A addr=([ctl]=2 [srv]=3 [n1]=11 [n2]=12 [n3]=13)
declare -A cpus=([n1]=2 [n2]=2 [n3]=1)
declare -A gres=([n1]=Gres=gpu:2)
net=10.231.0

ns_of() { echo "$(cat "$dir/ns-prefix")-$1"; }

# CMD on HOST: its namespace, its munge socket, the server's data hidden.
on() {
  local host=$1
  shift
  # nsenter, not `ip netns exec`: that remounts /sys without the cgroup
  # filesystem slurmd needs. A UTS namespace too: each host has its own name.
  $exec nsenter --net="/run/netns/$(ns_of "$host")" unshare -m -u --propagation slave /bin/sh -c '
    dir=$1 host=$2; shift 2
    hostname "$host"
    mount --bind "$dir/etc-hosts" /etc/hosts || exit 97
    mount --bind "$dir/hosts/$host/munge" "$dir/munge" || exit 97
    [ "$host" = srv ] || mount -t tmpfs -o size=1m,mode=0555 hidden "$dir/srv" || exit 97
    exec "$@"' sh "$dir" "$host" "$@"
}

boot() {  # host: its link, munged, and slurmd on a node
  local host=$1
  ip -n "$(ns_of "$host")" link set eth0 up
  on "$host" runuser -u munge -- /usr/sbin/munged --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
    --force
  [ -z "${cpus[$host]:-}" ] && return 0
  on "$host" env SLURM_CONF="$dir/slurm.conf" slurmd -N "$host" ||
    { say "slurmd did not start on $host; see $dir/hosts/$host/slurmd.log"; exit 1; }
}

kill_host() {
  local ns pids
  ns=$(ns_of "$1")
  for _ in $(seq 50); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] && return 0
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  say "processes still on $1: $pids"
}

stop() {
  [ -f "$dir/ns-prefix" ] || return 0
  local h
  for h in "${hosts[@]}"; do kill_host "$h"; ip netns del "$(ns_of "$h")" 2>/dev/null || true; done
  ip netns del "$(ns_of net)" 2>/dev/null || true
}

start() {
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null
  fi
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null;
                                   chown munge: /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  mkdir -p "$dir/munge" "$dir/srv" "$dir/shared" "$dir/state"
  chmod 755 "$dir" "$dir/shared"
  # Namespaces are named after DIR's inode, so two clusters on one machine do not meet.
  echo "cl$(stat -c %i "$dir")" >"$dir/ns-prefix"
  stop
  local h n=0
  ip netns add "$(ns_of net)"
  ip -n "$(ns_of net)" link add br0 type bridge
  ip -n "$(ns_of net)" link set br0 up
  for h in "${hosts[@]}"; do
    n=$((n + 1))
    mkdir -p "$dir/hosts/$h/munge" "$dir/hosts/$h/spool"
    chown munge: "$dir/hosts/$h/munge"
    ip netns add "$(ns_of "$h")"
    ip link add "clv$$-$n" type veth peer name "clp$$-$n"
    ip link set "clv$$-$n" netns "$(ns_of "$h")"
    ip link set "clp$$-$n" netns "$(ns_of net)"
    ip -n "$(ns_of "$h")" link set "clv$$-$n" name eth0
    ip -n "$(ns_of "$h")" addr add "$net.${addr[$h]}/24" dev eth0
    ip -n "$(ns_of "$h")" link set eth0 up
    ip -n "$(ns_of "$h")" link set lo up
    ip -n "$(ns_of net)" link set "clp$$-$n" master br0 up
  done
  { echo "127.0.0.1 localhost"; for h in "${hosts[@]}"; do echo "$net.${addr[$h]} $h"; done; } >"$dir/etc-hosts"
  local nodes="" h2
  for h2 in n1 n2 n3; do
    nodes+="NodeName=$h2 NodeAddr=$net.${addr[$h2]} CPUs=${cpus[$h2]} RealMemory=1000 ${gres[$h2]:-} State=UNKNOWN"$'\n'
  done
  # n1's two GPUs are on paper: device nodes no driver backs, enough
  # for Slurm to count, place and set CUDA_VISIBLE_DEVICES; nothing trains on them.
  mkdir -p "$dir/dev"
  rm -f "$dir/dev/fakegpu0" "$dir/dev/fakegpu1"
  mknod "$dir/dev/fakegpu0" c 195 0 && mknod "$dir/dev/fakegpu1" c 195 1
  echo "NodeName=n1 Name=gpu File=$dir/dev/fakegpu[0-1]" >"$dir/gres.conf"
  cat >"$dir/slurm.conf" <<CONF
ClusterName=circuitlab
SlurmctldHost=ctl($net.${addr[ctl]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/hosts/%n/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/hosts/%n/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/hosts/%n/slurmd.log
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
MinJobAge=300
$nodes
PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP
CONF
  for h in "${hosts[@]}"; do boot "$h"; done
  on ctl env SLURM_CONF="$dir/slurm.conf" slurmctld
  local state=""
  for _ in $(seq 150); do
    state=$(on ctl env SLURM_CONF="$dir/slurm.conf" sinfo -h -N -o %T 2>/dev/null | sort | uniq -c | xargs || true)
    [ "$state" = "3 idle" ] && break
    sleep 0.2
  done
  [ "$state" = "3 idle" ] || { say "the nodes did not become idle ($state)"; tail -5 "$dir/slurmctld.log" >&2; exit 1; }
  say "Slurm up: ctl, srv and nodes n1 (2 CPUs) n2 (2) n3 (1) in $dir"
  echo "export CLUSTER_DIR=$dir SLURM_CONF=$dir/slurm.conf"
}

case $cmd in
  start) dir=$(mkdir -p "$2" && cd "$2" && pwd); start ;;
  stop) dir=$2; stop ;;
  on) dir=$CLUSTER_DIR; shift; exec=exec on "$@" ;;  # exec: $! of `cluster_env.sh on HOST CMD &` is CMD's pid
  # A crash sends nothing: the link goes first, so no FIN or RST of the
  # killed processes' connections reaches another host.
  kill) dir=$CLUSTER_DIR; ip -n "$(ns_of "$2")" link set eth0 down; kill_host "$2" ;;
  boot) dir=$CLUSTER_DIR; boot "$2" ;;
  *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
