#!/usr/bin/env bash
# Scheduler overhead per tiny run (issue 20, target 6: < 20 ms submit -> SUCCEEDED
# for a 1-step run with the smallest evaluation): a real server on the local
# executor, bench/scheduler_overhead_bench as the client. Results: bench/RESULTS.md.
#   bench/scheduler_overhead.sh [RUNS]     (BUILD_DIR default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
[ -x "$build/bench/scheduler_overhead_bench" ] ||
  cmake --build "$build" --target circuitlab-server scheduler_overhead_bench
tmp=$(mktemp -d)
"$build/server/circuitlab-server" --data "$tmp/data" --listen 127.0.0.1:0 --http '' >"$tmp/ready" 2>"$tmp/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
until grep -q "^listening port=" "$tmp/ready" 2>/dev/null; do sleep 0.1; done
"$build/bench/scheduler_overhead_bench" --server "127.0.0.1:$(sed -n 's/^listening port=//p' "$tmp/ready")" --runs "${1:-30}"
