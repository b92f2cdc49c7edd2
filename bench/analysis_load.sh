#!/usr/bin/env bash
# Issue 13's figures: GetRun latency (p50/p99) on an idle server and while 8
# heavy analysis jobs run, then SIGTERM with 8 heavy jobs in flight (time to
# exit, exit code). Starts its own circuitlab-server on a free loopback port
# with a temporary data directory, trains bench/specs/long_seq_imir.json.
#   bench/analysis_load.sh [JOBS] [N_EVAL] [KIND]    # defaults 8 4096 intervene (~30 s a job here)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${1:-8}"
n_eval="${2:-4096}"
kind="${3:-intervene}"
server=build/server/circuitlab-server
bench=build/bench/analysis_load_bench
[ -x "$server" ] && [ -x "$bench" ] || cmake --build build --target circuitlab-server circuitlab analysis_load_bench
data=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -KILL $pid 2>/dev/null; rm -rf "$data"' EXIT

start_server() {
  "$server" --data "$data" --listen 127.0.0.1:0 --log-level warn >"$data/ready" 2>>"$data/server.log" &
  pid=$!
  until grep -q "^listening port=" "$data/ready" 2>/dev/null; do sleep 0.1; done
  addr="127.0.0.1:$(sed -n 's/^listening port=//p' "$data/ready")"
}
start_server
cli="build/client/circuitlab --server $addr"
run=$($cli submit bench/specs/long_seq_imir.json)
$cli watch "$run" >/dev/null 2>&1 || true
echo "== $kind x $jobs, n_eval $n_eval, run $run ($(nproc) cores, 1 analysis worker, 1 CPU slot)"
"$bench" --server "$addr" --run "$run" --jobs "$jobs" --n-eval "$n_eval" --kind "$kind"

# SIGTERM with the jobs in flight: fresh seeds, so none is a stored answer.
"$bench" --server "$addr" --run "$run" --jobs "$jobs" --n-eval "$n_eval" --kind "$kind" --reads 0 \
  >/dev/null 2>&1 &
load=$!
until [ "$($cli --json analyses 2>/dev/null | grep -c '"job_id"')" -ge "$jobs" ]; do sleep 0.1; done
t0=$(date +%s%N)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
t1=$(date +%s%N)
pid=
wait "$load" 2>/dev/null || true
ms=$(( (t1 - t0) / 1000000 ))
printf "SIGTERM with %d %s jobs queued/running: exit code %d after %d.%03d s\n" "$jobs" "$kind" "$rc" \
  $(( ms / 1000 )) $(( ms % 1000 ))
