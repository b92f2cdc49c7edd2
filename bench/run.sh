#!/usr/bin/env bash
# Side-by-side benchmark: circuitlab's C++/LibTorch training step against the
# Python PyTorch peer (Debian's python3-torch) on the same model and the same
# batches, once with OpenBLAS (what set-up installs) and once with Debian's
# reference BLAS. Prints JSON lines and a Markdown table for bench/RESULTS.md.
#   bench/run.sh [SPEC.json] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:-examples/induction.json}"
steps="${2:-200}"
bin=build/bench/imir_train_bench
. bench/peer_env.sh
ensure_bench_env "$bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| BLAS | C++ full step (gen+fwd+bwd+SGD) | C++ model step | Python model step | C++/Python | eval pass |"
echo "|---|---|---|---|---|---|"
for blas in openblas reference; do
  envs=(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)
  n=$steps
  if [ "$blas" = reference ]; then
    envs+=(LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/blas)
    n=$(( steps / 10 > 5 ? steps / 10 : 5 ))
  fi
  env "${envs[@]}" "$bin" --spec "$spec" --steps "$n" --warmup 5 --dump "$tmp/batches.bin" >"$tmp/cpp.json"
  env "${envs[@]}" /usr/bin/python3 bench/imir_peer.py "$tmp/batches.bin" --steps "$n" --warmup 5 >"$tmp/py.json"
  cat "$tmp/cpp.json" "$tmp/py.json" >&2
  /usr/bin/python3 - "$blas" "$tmp/cpp.json" "$tmp/py.json" <<'PY'
import json, sys
blas, c, p = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
print(f"| {blas} | {c['full_steps_per_s']:.1f} steps/s | {c['model_steps_per_s']:.1f} steps/s | "
      f"{p['model_steps_per_s']:.1f} steps/s | {c['model_steps_per_s'] / p['model_steps_per_s']:.2f} | "
      f"{c['eval_pass_s']:.3f} s |")
PY
done
