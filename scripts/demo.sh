#!/usr/bin/env bash
# The main job on a fresh machine: set up, start circuitlab-server on its
# embedded SQLite default (./data), run the demo experiment from examples/
# through the client with a live progress bar, print its results, then stop
# the server cleanly (SIGTERM). Re-running adds a new run to the same ./data.
#   scripts/demo.sh [SPEC.json]     # default examples/induction.json
# Environment: CIRCUITLAB_DATA (default ./data), CIRCUITLAB_PORT (default 50051).
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:-examples/induction.json}"
data="${CIRCUITLAB_DATA:-./data}"
port="${CIRCUITLAB_PORT:-50051}"
scripts/setup.sh
server=build/server/circuitlab-server
cli="build/client/circuitlab --server 127.0.0.1:${port}"

mkdir -p "$data"
echo "==> starting circuitlab-server (data: $data, listening on 127.0.0.1:${port}, log: $data/server.log)"
"$server" --data "$data" --listen "127.0.0.1:${port}" >>"$data/server.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  $cli --timeout 1 health >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { echo "server failed to start:"; tail -20 "$data/server.log"; exit 1; }
  sleep 0.2
done
$cli health

echo "==> submitting $spec"
run=$($cli submit "$spec")
$cli watch "$run"
echo "==> $run metrics (circuitlab metrics $run --csv exports every point)"
$cli metrics "$run"
echo "==> runs in $data"
$cli ls
kill -TERM $pid
wait $pid
trap - EXIT
echo "==> server stopped cleanly; restart it with: $server --data $data --listen 127.0.0.1:${port}"
