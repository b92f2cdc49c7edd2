#!/usr/bin/env bash
# Ensemble packing of sweep members (scheduler): a sweep of SEEDS seeds of one
# spec on one CPU slot, trained as one ensemble job (--max-ensemble SEEDS) and
# one run at a time (--max-ensemble 1), through the real server and CLI.
# Prints a Markdown table of wall time per sweep and runs per minute.
#   bench/ensemble_pack.sh [SPEC] [SEEDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:-examples/induction.json}"
seeds="${2:-8}"
steps="${3:-300}"
[ -x build/server/circuitlab-server ] || scripts/setup.sh >/dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
/usr/bin/python3 - "$spec" "$seeds" "$steps" > "$work/sweep.json" <<'PY'
import json, sys
spec, seeds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = json.load(open(spec))
base["training"]["steps"] = steps
base["recording"] = {"metrics_every": 10, "eval_every": steps, "eval_size": 512, "checkpoint_every": steps}
print(json.dumps({"name": "pack-bench", "base": base,
                  "axes": [{"field": "seed", "values": list(range(1, seeds + 1))}]}))
PY
echo "| packing | runs | steps each | wall time (s) | runs per minute |"
echo "|---|---|---|---|---|"
for pack in "$seeds" 1; do
  rm -rf "$work/data"
  OPENBLAS_NUM_THREADS=1 build/server/circuitlab-server --data "$work/data" --listen 127.0.0.1:0 --cpu-slots 1 \
    --max-ensemble "$pack" > "$work/server.log" 2>&1 &
  pid=$!
  port=""
  for _ in $(seq 100); do
    port=$(sed -n 's/^listening port=//p' "$work/server.log")
    [ -n "$port" ] && break
    sleep 0.1
  done
  start=$(date +%s.%N)
  build/client/circuitlab --server "127.0.0.1:$port" sweep "$work/sweep.json" --watch > /dev/null 2>&1
  end=$(date +%s.%N)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  /usr/bin/python3 -c "
t = $end - $start
print('| %s | $seeds | $steps | %.1f | %.1f |' % ('ensemble of $pack' if $pack > 1 else 'one at a time', t, $seeds * 60 / t))"
done
