#!/usr/bin/env bash
# Issue 15's figure: what TLS costs on the submit / GetRun / WatchRun paths
# and on a new connection. Two servers on free loopback ports, both with a
# tokens file, one plaintext (gRPC local credentials) and one TLS (certificates
# from scripts/dev-certs.sh); the same client calls against each, one after
# the other; prints p50 latencies and the TLS / plaintext ratio.
#   bench/tls_cost.sh [N]     # N calls per path (default 300; GetRun 4N)
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-300}"
server=build/server/circuitlab-server
bench=build/bench/tls_cost_bench
[ -x "$server" ] && [ -x "$bench" ] || cmake --build build --target circuitlab-server tls_cost_bench
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
scripts/dev-certs.sh "$tmp/certs" >/dev/null
scripts/add-principal.sh bench user "$tmp/tokens.txt" "$tmp" >/dev/null
cat > "$tmp/spec.json" <<'JSON'
{"name": "tls-bench", "task": {"associative_recall": {"num_common": 4, "num_rare": 12, "num_heldout": 4,
 "num_blocks": 4, "num_positions": 8}}, "training": {"steps": 1, "batch_size": 8},
 "recording": {"eval_size": 16}}
JSON

run() {  # name, extra server flags...
  local name=$1; shift
  "$server" --data "$tmp/$name" --listen 127.0.0.1:0 --log-level warn --auth-tokens-file "$tmp/tokens.txt" \
    --max-queued-per-client 100000 --max-queued-runs 100000 "$@" >"$tmp/$name.ready" 2>>"$tmp/$name.log" &
  pids+=($!)
  until grep -q "^listening port=" "$tmp/$name.ready" 2>/dev/null; do sleep 0.1; done
  local addr="127.0.0.1:$(sed -n 's/^listening port=//p' "$tmp/$name.ready")"
  local ca=()
  [ "$name" = tls ] && ca=(--ca-cert "$tmp/certs/ca.pem")
  "$bench" --server "$addr" --token-file "$tmp/bench.token" --spec "$tmp/spec.json" --n "$n" "${ca[@]}" \
    > "$tmp/$name.out"
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" || true
}
run plain
run tls --tls-cert "$tmp/certs/server.pem" --tls-key "$tmp/certs/server.key"
echo "== TLS cost, $(nproc) cores, $n calls per path (GetRun $((4 * n))), p50 latency"
printf '%-16s %12s %12s %10s\n' path plaintext_ms tls_ms tls/plain
join <(sort "$tmp/plain.out") <(sort "$tmp/tls.out") |
  awk '{printf "%-16s %12.3f %12.3f %10.2f\n", $1, $4, $9, $9 / $4}'
