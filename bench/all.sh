#!/usr/bin/env bash
# Every performance figure of issue 20 in one table, each against its target:
# the IMIR and decoder model steps against the Python peer (side by side, one
# thread each, OpenBLAS), data generation's share of the full step, the
# 64-run phase diagram through the server, store ingest, scheduler overhead,
# and with --clean-build the clean full build (row 7).
# Run it on a quiet machine; the table is what bench/RESULTS.md records.
#   bench/all.sh [--quick | --models] [--clean-build]
#     --quick: fewer steps, no phase diagram; --models: the model-step rows 1-3
#     only; --clean-build: also time a clean full build (a fresh build folder,
#     ccache off, every target incl. tests; ~12 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
quick=0
models=0
clean_build=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --models) models=1 ;;
    --clean-build) clean_build=1 ;;
    *) echo "unknown option $a (see the header of $0)" >&2; exit 2 ;;
  esac
done
steps=$([ $quick = 1 ] && echo 40 || echo 200)
. bench/peer_env.sh
ensure_bench_env "$build/bench/imir_train_bench"
cmake --build "$build" --target imir_train_bench decoder_train_bench coordinate_query_bench \
  scheduler_overhead_bench circuitlab-server circuitlab >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
rows="$tmp/rows.jsonl"
for spec in examples/induction.json bench/specs/imir_medium.json; do
  echo "== IMIR $spec" >&2
  "$build/bench/imir_train_bench" --spec "$spec" --steps "$steps" --warmup 5 --dump "$tmp/b.bin" >"$tmp/c.json"
  /usr/bin/python3 bench/imir_peer.py "$tmp/b.bin" --steps "$steps" --warmup 5 >"$tmp/p.json"
  /usr/bin/python3 -c "import json,sys; c=json.load(open('$tmp/c.json')); p=json.load(open('$tmp/p.json'))
print(json.dumps({'kind': 'imir', 'spec': '$spec', 'cpp': c, 'py': p}))" >>"$rows"
done
# The decoder: the CPU sizes (SCIENCE.md B.4) and the papers' B.2 and B.3, at
# one thread and at two (the run's batch split over two threads, against the
# peer at torch.set_num_threads(2)). SPEC:STEPS[:BATCH]: B.3 at its batch of 256
# needs ~19 GB (the server's estimate; 4 GB is its default limit), so it runs at 32 (the same work per
# sequence; its 30k-step hours are scaled by 256/32).
for entry in examples/dice_task_vectors.json:100 bench/specs/dice_tv_small.json:100 \
  bench/specs/regression_tv_small_e2.json:100 bench/specs/tv_paper_b2.json:20 bench/specs/tv_paper_b3_e2.json:3:32; do
  IFS=: read -r spec n batch <<<"$entry"
  batch=${batch:-0}
  [ $quick = 1 ] && n=$(( n > 20 ? 20 : n ))
  w=$(( n >= 20 ? 5 : 1 ))
  for threads in 1 2; do
    echo "== decoder $spec, $threads thread(s)" >&2
    "$build/bench/decoder_train_bench" --spec "$spec" --steps "$n" --warmup "$w" --fixed-batches 2 --threads "$threads" --batch "$batch" \
      --dump "$tmp/d.bin" >"$tmp/c.json"
    OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads /usr/bin/python3 bench/decoder_peer.py "$tmp/d.bin" \
      --steps "$n" --warmup "$w" --threads "$threads" >"$tmp/p.json"
    /usr/bin/python3 -c "import json,sys; c=json.load(open('$tmp/c.json')); p=json.load(open('$tmp/p.json'))
sb = json.load(open('$spec'))['training'].get('batch_size') if $batch else None
print(json.dumps({'kind': 'decoder', 'spec': '$spec', 'threads': $threads, 'batch': $batch, 'spec_batch': sb, 'cpp': c, 'py': p}))" >>"$rows"
  done
done
if [ $models = 0 ]; then
  echo "== store ingest" >&2
  "$build/bench/coordinate_query_bench" $([ $quick = 1 ] && echo "--steps 200") 2>/dev/null | tail -1 |
    /usr/bin/python3 -c "import json,sys; print(json.dumps({'kind': 'ingest', 'r': json.load(sys.stdin)}))" >>"$rows"
  echo "== scheduler overhead" >&2
  bench/scheduler_overhead.sh $([ $quick = 1 ] && echo 10 || echo 30) | grep "(total)" |
    /usr/bin/python3 -c "import json,sys; print(json.dumps({'kind': 'sched', 'median_ms': float(sys.stdin.read().split('median')[1].split()[0])}))" >>"$rows"
fi
if [ $quick = 0 ] && [ $models = 0 ]; then
  echo "== phase diagram (64 runs)" >&2
  bench/phase_diagram.sh 2>/dev/null | tail -1 |
    /usr/bin/python3 -c "import json,sys; print(json.dumps({'kind': 'phase', 'r': json.load(sys.stdin)}))" >>"$rows"
fi
if [ $clean_build = 1 ]; then
  echo "== clean full build" >&2
  fresh="$tmp/clean-build"
  t0=$(date +%s.%N)
  CCACHE_DISABLE=1 cmake -S . -B "$fresh" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  CCACHE_DISABLE=1 cmake --build "$fresh" >/dev/null
  /usr/bin/python3 -c "import json; print(json.dumps({'kind': 'build', 's': $(date +%s.%N) - $t0}))" >>"$rows"
fi
/usr/bin/python3 - "$rows" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| # | figure | measured | target | met |")
print("|---|---|---|---|---|")
def line(n, what, value, target, ok):
    print(f"| {n} | {what} | {value} | {target} | {'yes' if ok else '**no**'} |")
STEP_RATIO = {"imir": (1, "IMIR", 3.0), "decoder": (2, "decoder", 1.5)}  # row, model, target ratio
for kind in STEP_RATIO:
    for r in (r for r in rows if r["kind"] == kind):
        n, model, target = STEP_RATIO[kind]
        threads = r.get("threads", 1)
        if kind == "decoder" and "b3" in r["spec"]:
            target = 1.3  # issue 37: B.3 >= 1.3x
        c, p = r["cpp"], r["py"]
        ratio = c["model_steps_per_s"] / p["model_steps_per_s"]
        # IMIR: the dense step's FLOPs at the achieved rate over one core's GEMM rate
        # (> 1: the kernel skips work the dense formulation does).
        roof = (f"; dense-step FLOPs at {c['dense_roofline_fraction']:.2f}x the {c['gemm_gflops']:.0f} GFLOP/s "
                f"GEMM roofline" if "dense_roofline_fraction" in c else "")
        at = f", batch {r['cpp']['batch']}" if r.get("batch") else ""
        line(n, f"{model} model step C++/Python, `{r['spec']}`{at}" + (f", {threads} threads each" if threads > 1 else ""),
             f"{ratio:.2f} ({c['model_steps_per_s']:.1f} / {p['model_steps_per_s']:.1f} steps/s{roof})",
             f">= {target:g}", ratio >= target)
one = {r["spec"]: r for r in rows if r["kind"] == "decoder" and r["threads"] == 1}
for r in rows:
    if r["kind"] == "decoder" and r["threads"] > 1 and r["spec"] in one:
        # Scaling of one run with its threads (the batch split), and the peer's for context.
        c1, p1 = one[r["spec"]]["cpp"], one[r["spec"]]["py"]
        sc = r["cpp"]["model_steps_per_s"] / c1["model_steps_per_s"]
        sp = r["py"]["model_steps_per_s"] / p1["model_steps_per_s"]
        line(8, f"decoder step, {r['threads']} threads / 1 thread, `{r['spec']}`",
             f"{sc:.2f} (peer {sp:.2f})", ">= 1.6", sc >= 1.6)
for r in rows:
    if r["kind"] == "decoder":
        # A 30k-step run (the papers' E1/E2 length) at the server's full step rate; a row measured at
        # a smaller batch than the spec's is scaled to the spec's (B.3: 256 / 64).
        scale = r["spec_batch"] / r["cpp"]["batch"] if r.get("spec_batch") else 1
        hours = 30000 / r["cpp"]["full_steps_per_s"] / 3600 * scale
        note = f", measured at batch {r['cpp']['batch']}, x{scale:g}" if scale != 1 else ""
        line(9, f"hours for 30k steps, `{r['spec']}`, {r['threads']} thread(s)", f"{hours:.1f} h "
             f"(peer {30000 / r['py']['model_steps_per_s'] / 3600 * scale:.1f} h{note})", "-", True)
for r in rows:
    if r["kind"] in ("imir", "decoder") and r.get("threads", 1) == 1:
        # The share of the full step spent waiting for the training batch (data generation the
        # prefetch thread did not hide), and for context the whole gap between the server's
        # step and the bare model step (which also counts the trainer's own per-step work).
        c = r["cpp"]
        share = c["data_wait_share"]
        gap = max(0.0, 1 - c["full_steps_per_s"] / c["model_steps_per_s"])
        line(3, f"data generation share of the full step, `{r['spec']}`",
             f"{100 * share:.1f}% (full {c['full_steps_per_s']:.1f} steps/s; whole gap to the model step "
             f"{100 * gap:.1f}%)", "<= 5%", share <= 0.05)
for r in rows:
    if r["kind"] == "phase":
        t = r["r"]["total_s"]
        line(4, "64-run phase diagram, submit to last label",
             f"{t:.1f} s (train {r['r']['train_s']:.1f} + labels {r['r']['labels_s']:.1f})", "<= 60 s", t <= 60)
    if r["kind"] == "ingest":
        i = r["r"]
        line(5, "coordinate ingest through the store writer", f"{i['rows_per_s'] / 1000:.0f}k rows/s "
             f"(queries {i['series_ms']:.2f} / {i['at_step_ms']:.2f} / {i['last_of_runs_ms']:.2f} ms)",
             ">= 200k rows/s", i["rows_per_s"] >= 200000)
    if r["kind"] == "sched":
        line(6, "scheduler overhead, 1-step run submit -> SUCCEEDED (median)", f"{r['median_ms']:.1f} ms",
             "< 20 ms", r["median_ms"] < 20)
    if r["kind"] == "build":
        line(7, "clean full build, every target incl. tests, ccache off", f"{r['s'] / 60:.1f} min ({r['s']:.0f} s)",
             "<= 12 min", r["s"] <= 720)
PY
