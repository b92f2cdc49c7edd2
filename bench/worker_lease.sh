#!/usr/bin/env bash
# Remote workers' overhead (issue 17; results in bench/RESULTS.md):
#   1. worker_bench against a server on --executor workers: lease overhead
#      (submit answered -> Lease at a worker) and metric throughput (points a
#      worker streams per second, stored);
#   2. a tiny run (20 steps) end to end through the CLI (submit --watch) on a
#      real circuitlab-worker vs on the local executor: what a user waits.
#   bench/worker_lease.sh            (BUILD_DIR default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"' EXIT
sed -e 's/"steps": 600/"steps": 20/' -e 's/"eval_every": 50/"eval_every": 20/' \
  -e 's/"checkpoint_every": 200/"checkpoint_every": 20/' examples/induction.json >"$tmp/tiny.json"

serve() {  # name args... -> $port (not in a subshell: the trap must see the pid)
  "$build/server/circuitlab-server" --data "$tmp/$1" --listen 127.0.0.1:0 "${@:2}" >"$tmp/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    port=$(grep -o "port=[0-9]*" "$tmp/$1.log" | cut -d= -f2 || true)
    [ -n "$port" ] && return
    sleep 0.1
  done
  echo "server $1 did not start" >&2; exit 1
}

serve proto --executor workers --remote-slots 1
"$build/bench/worker_bench" --server "127.0.0.1:$port" --spec "$tmp/tiny.json" --runs 30 --points 2000000

tiny() {  # port -> median seconds of 5 tiny runs, submit to SUCCEEDED
  for _ in 1 2 3 4 5; do
    s=$(date +%s%N)
    "$build/client/circuitlab" --server "127.0.0.1:$1" submit "$tmp/tiny.json" --watch >/dev/null
    echo $(( ($(date +%s%N) - s) / 1000000 ))
  done | sort -n | sed -n 3p
}
serve workers --executor workers --remote-slots 1
wport=$port
"$build/worker/circuitlab-worker" --server "127.0.0.1:$wport" >"$tmp/worker.log" 2>&1 &
pids+=($!)
sleep 1
serve local --cpu-slots 1
lport=$port
echo "tiny run (20 steps) submit --watch to SUCCEEDED, median of 5: worker $(tiny "$wport") ms, local $(tiny "$lport") ms"
