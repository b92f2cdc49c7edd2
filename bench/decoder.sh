#!/usr/bin/env bash
# Side-by-side benchmark of the decoder training step (SCIENCE.md B.2; B.3 on
# the E2 regression spec): the C++/LibTorch engine against the Python PyTorch
# peer (Debian's python3-torch) on the same model, the same initial weights
# and the same batches, one thread each, with OpenBLAS. Prints JSON lines and a Markdown table row per
# spec for bench/RESULTS.md.
#   bench/decoder.sh [STEPS] [SPEC.json ...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-100}"
shift || true
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(examples/dice_task_vectors.json bench/specs/dice_tv_small.json bench/specs/regression_tv_small_e2.json)
bin=build/bench/decoder_train_bench
. bench/peer_env.sh
ensure_bench_env "$bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| spec | C++ full step (gen+fwd+bwd+clip+AdamW) | C++ model step | Python model step | C++/Python | first losses C++ / Python |"
echo "|---|---|---|---|---|---|"
for spec in "${specs[@]}"; do
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$bin" --spec "$spec" --steps "$steps" --dump "$tmp/dump.bin" >"$tmp/cpp.json"
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 bench/decoder_peer.py "$tmp/dump.bin" --steps "$steps" >"$tmp/py.json"
  cat "$tmp/cpp.json" "$tmp/py.json" >&2
  /usr/bin/python3 - "$spec" "$tmp/cpp.json" "$tmp/py.json" <<'PY'
import json, sys
spec, c, p = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
print(f"| `{spec}` | {c['full_steps_per_s']:.1f} steps/s | {c['model_steps_per_s']:.1f} steps/s | "
      f"{p['model_steps_per_s']:.1f} steps/s | {c['model_steps_per_s'] / p['model_steps_per_s']:.2f} | "
      f"{c['first_losses'][0]:.4f}, {c['first_losses'][-1]:.4f} / {p['first_losses'][0]:.4f}, {p['first_losses'][-1]:.4f} |")
PY
done
