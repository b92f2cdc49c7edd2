#!/usr/bin/env bash
# Coordinate-parameterised models: the block-sparse forward (few block pairs
# carry a coordinate) and the dense forward on materialised matrices (the
# whole paper basis) against the FULL dense model, on 2-hop k-hop specs
# (bench/specs). One thread, OpenBLAS. Prints a Markdown table.
#   bench/sparse_forward.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-50}"
bin=build/bench/imir_train_bench
[ -x "$bin" ] || scripts/setup.sh >/dev/null
echo "| spec | forward | trained parameters | model step (steps/s) | full step incl. sampling (steps/s) |"
echo "|---|---|---|---|---|"
for name in khop_L3_dense khop_L3_paper khop_L3_circuit khop_L5_dense khop_L5_circuit; do
  OPENBLAS_NUM_THREADS=1 "$bin" --spec "bench/specs/$name.json" --steps "$steps" --warmup 5 2>/dev/null | tail -1 |
    /usr/bin/python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print('| $name | %s | %s | %.1f | %.1f |' % (d.get('forward', '?'), d.get('parameters', '?'), d['model_steps_per_s'], d['full_steps_per_s']))"
done
