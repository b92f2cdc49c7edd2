#!/usr/bin/env bash
# The 64-run phase diagram (examples/phase_diagram.json) through the real
# server and CLI, submit to the last label (issue 20, target 4: <= 60 s on
# the 2-core machine, both cores busy): the sweep trained on one CPU slot per
# core, then `sweep-summary --pivot a b --value pair --wait` (every member's
# LabelRun, one analysis worker per core). Prints one JSON line: train_s,
# labels_s, total_s, labelled.
#   bench/phase_diagram.sh [SWEEP.json] [server flags...]   (BUILD_DIR default build/;
#     server flags replace the default --cpu-slots N --analysis-workers N, N = the online cores)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
sweep="${1:-examples/phase_diagram.json}"
shift || true
cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it follows OMP_NUM_THREADS, which bench/all.sh sets to 1
[ $# -gt 0 ] || set -- --cpu-slots "$cores" --analysis-workers "$cores"
[ -x "$build/server/circuitlab-server" ] && [ -x "$build/client/circuitlab" ] ||
  cmake --build "$build" --target circuitlab-server circuitlab
tmp=$(mktemp -d)
"$build/server/circuitlab-server" --data "$tmp/data" --listen 127.0.0.1:0 --http '' "$@" >"$tmp/ready" 2>"$tmp/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
until grep -q "^listening port=" "$tmp/ready" 2>/dev/null; do sleep 0.1; done
cli=("$build/client/circuitlab" --server "127.0.0.1:$(sed -n 's/^listening port=//p' "$tmp/ready")")
start=$(date +%s.%N)
"${cli[@]}" sweep "$sweep" --watch >"$tmp/sweep.out" 2>&1
trained=$(date +%s.%N)
id=$(grep -o 's[0-9]\+' "$tmp/sweep.out" | head -1)
"${cli[@]}" sweep-summary "$id" --pivot a b --value pair --wait >"$tmp/map.txt"
end=$(date +%s.%N)
cat "$tmp/map.txt" >&2
labelled=$(grep -c . "$tmp/map.txt" || true)
/usr/bin/python3 -c "
import json
print(json.dumps({'sweep': '$sweep', 'train_s': round($trained - $start, 1), 'labels_s': round($end - $trained, 1),
                  'total_s': round($end - $start, 1), 'summary_lines': $labelled}))"
