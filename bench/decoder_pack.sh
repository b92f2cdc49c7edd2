#!/usr/bin/env bash
# Packing decoder sweep members (issue 48), side by side with the Python peer:
# member steps per second of MEMBERS members of one decoder spec trained one
# after another and as one packed ensemble step, at 1 and 2 threads. C++:
# decoder_train_bench's full server step (data generation included) with
# --members 1 and --members MEMBERS. Python (Debian's python3-torch, the same
# model, initial weights and batches): MEMBERS runs one after another, and one
# functorch vmap step over the stacked members. Prints a Markdown table; then
# a second one of the task-vector analyses' forward (decoder_train_bench
# --hidden-states: 2048 sequences, every block's stream captured) for 3
# members, a 3-seed reproduction's analyses, one after another and packed.
#   bench/decoder_pack.sh [MEMBERS] [STEPS] [SPEC.json ...]
set -euo pipefail
cd "$(dirname "$0")/.."
members="${1:-8}"
steps="${2:-30}"
shift 2 || true
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(examples/dice_task_vectors.json bench/specs/dice_tv_small.json)
bin=build/bench/decoder_train_bench
. bench/peer_env.sh
ensure_bench_env "$bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "| spec | threads | C++ one after another | C++ packed ($members) | packed / one after another | Python one after another | Python vmap ($members) | C++ packed / Python one after another | C++ packed / Python vmap |"
echo "|---|---|---|---|---|---|---|---|---|"
for spec in "${specs[@]}"; do
  for threads in 1 2; do
    "$bin" --spec "$spec" --steps "$steps" --warmup 3 --threads "$threads" --dump "$tmp/dump.bin" >"$tmp/alone.json"
    "$bin" --spec "$spec" --steps "$steps" --warmup 3 --threads "$threads" --members "$members" >"$tmp/packed.json"
    /usr/bin/python3 bench/decoder_peer.py "$tmp/dump.bin" --steps "$steps" --warmup 3 --threads "$threads" \
      --members "$members" >"$tmp/py.json"
    /usr/bin/python3 bench/decoder_peer.py "$tmp/dump.bin" --steps "$steps" --warmup 3 --threads "$threads" \
      --members "$members" --vmap >"$tmp/vmap.json"
    cat "$tmp/alone.json" "$tmp/packed.json" "$tmp/py.json" "$tmp/vmap.json" >&2
    /usr/bin/python3 - "$spec" "$threads" "$tmp" <<'PY'
import json, sys
spec, threads, tmp = sys.argv[1:4]
r = {k: json.load(open(f"{tmp}/{k}.json")) for k in ("alone", "packed", "py", "vmap")}
alone, packed = r["alone"]["member_steps_per_s"], r["packed"]["member_steps_per_s"]
py, vm = r["py"]["member_steps_per_s"], r["vmap"]["member_steps_per_s"]
print(f"| `{spec}` | {threads} | {alone:.1f} | {packed:.1f} | {packed / alone:.2f} | {py:.1f} | {vm:.1f} | "
      f"{packed / py:.2f} | {packed / vm:.2f} |")
PY
  done
done
echo
echo "| spec | threads | analysis forward, one after another (member sequences/s) | packed (3) | packed / one after another |"
echo "|---|---|---|---|---|"
for spec in "${specs[@]}"; do
  for threads in 1 2; do
    "$bin" --spec "$spec" --hidden-states 2048 --members 3 --steps 6 --threads "$threads" >"$tmp/hidden.json"
    cat "$tmp/hidden.json" >&2
    /usr/bin/python3 - "$spec" "$threads" "$tmp/hidden.json" <<'PY'
import json, sys
spec, threads, path = sys.argv[1:4]
r = json.load(open(path))
a, p = r["alone_member_seqs_per_s"], r["packed_member_seqs_per_s"]
print(f"| `{spec}` | {threads} | {a:.0f} | {p:.0f} | {p / a:.2f} |")
PY
  done
done
