#!/usr/bin/env bash
# The main job on a fresh machine: set up (Debian packages, build, and
# `cmake --install` into CIRCUITLAB_PREFIX, default /usr/local: circuitlab,
# circuitlab-server and circuitlab-worker on PATH, the Python package
# importable), start circuitlab-server on its
# embedded SQLite default (./data), run the demo experiment from examples/
# through the client with a live progress bar, print its results, then (with
# the default spec) train the task-vector demo (examples/dice_task_vectors.json)
# and print its geometry, then stop the server cleanly (SIGTERM). Re-running
# adds new runs to the same ./data.
#   scripts/demo.sh [SPEC.json]     # default examples/induction.json
# Environment: CIRCUITLAB_DATA (default ./data), CIRCUITLAB_PORT (default 50051),
# CIRCUITLAB_PREFIX (default /usr/local), CIRCUITLAB_HTTP (the HTTP port; default the server's, 127.0.0.1:8080).
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:-examples/induction.json}"
data="${CIRCUITLAB_DATA:-./data}"
port="${CIRCUITLAB_PORT:-50051}"
prefix="${CIRCUITLAB_PREFIX:-/usr/local}"
http_flag=()   # the server's default HTTP port (8080; left off, with a warning, when taken)
if [ -n "${CIRCUITLAB_HTTP:-}" ]; then http_flag=(--http "$CIRCUITLAB_HTTP"); fi
# The server, CLI, worker and Python package only (no test binaries), installed.
scripts/setup.sh --binaries --python --install
server="$prefix/bin/circuitlab-server"
cli="$prefix/bin/circuitlab --server 127.0.0.1:${port}"

mkdir -p "$data"
echo "==> starting circuitlab-server (data: $data, listening on 127.0.0.1:${port}, log: $data/server.log)"
ready="$data/server.ready"
rm -f "$ready"
"$server" --data "$data" --listen "127.0.0.1:${port}" "${http_flag[@]}" >"$ready" 2>>"$data/server.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
# Our own server says "listening port=N" once it serves (another process on
# the port would answer health checks too).
until grep -q "^listening port=" "$ready" 2>/dev/null; do
  kill -0 $pid 2>/dev/null || { echo "server failed to start:"; tail -5 "$data/server.log"; exit 1; }
  sleep 0.2
done
$cli health
sleep 0.2  # the "http port=" line follows the "listening" one
dashboard=$(sed -n 's/^http port=[0-9]* url=//p' "$ready")
if [ -n "$dashboard" ]; then echo "==> dashboard: $dashboard (open it to watch the runs below train)"; fi

echo "==> submitting $spec"
run=$($cli submit "$spec")
$cli watch "$run"
echo "==> $run metrics (circuitlab metrics $run --csv exports every point)"
$cli metrics "$run"
echo "==> $run IMIR coordinates over training: induction head (alpha, beta, gamma), in-weights map (delta),"
echo "    off-manifold residual rho (circuitlab coords $run --csv exports them; circuitlab project $run projects a checkpoint)"
$cli coords "$run" --name alpha --name beta --name gamma --name delta
if [ $# -eq 0 ]; then
  echo "==> the task-vector half: a decoder on E1 biased dice (examples/dice_task_vectors.json)"
  tv=$($cli submit examples/dice_task_vectors.json)
  $cli watch "$tv"
  echo "==> $tv task-vector geometry at the last layer (circuitlab task-vectors $tv gives every analysis; --csv exports):"
  echo "    P0 residual ratio falls with context, P3 weights track the posterior, steering follows the mixture,"
  echo "    OOD states stay in the task subspace at this diversity"
  $cli task-vectors "$tv" --analysis p0,p3,steering,ood_r2 --layer 2
fi
echo "==> runs in $data"
$cli ls
if [ -n "$dashboard" ]; then echo "==> the run's dashboard page: $($cli open "$run" --dashboard "$dashboard")"; fi
kill -TERM $pid
wait $pid
trap - EXIT
echo "==> server stopped cleanly; restart it with: circuitlab-server --data $data"
echo "==> installed in $prefix: bin/circuitlab, bin/circuitlab-server, bin/circuitlab-worker, the Python"
echo "    package circuitlab, the examples (share/circuitlab) and the docs (share/doc/circuitlab)"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "==> $prefix/bin is not on your PATH; every page of the docs calls the commands by name:"
     echo "    export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
pydir="$prefix/lib/$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')/dist-packages"
if ! (cd / && python3 -c 'import circuitlab' 2>/dev/null); then
  echo "==> python3 does not look in $pydir; for the Python pages:"
  echo "    export PYTHONPATH=\"$pydir\${PYTHONPATH:+:\$PYTHONPATH}\""
fi
echo "==> next: docs/tutorials/train-and-watch.md (the docs site: scripts/docs.sh serve)"
