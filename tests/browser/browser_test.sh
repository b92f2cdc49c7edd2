#!/usr/bin/env bash
# The browser tier: Debian's chromium, headless, driven by npm puppeteer-core
# (tests/browser/dashboard_check.cjs) against a real circuitlab-server that
# has trained two runs and a 2x2 sweep while a third run trains live; then
# reproductions' pages, and a packed sweep's runs (--max-ensemble 2).
# Also: `promtool check metrics` on a /metrics scrape (Debian's prometheus),
# and the counters moving when runs end. Screenshots go to
# $BUILD_DIR/browser/ (the README's come from here).
# Installs chromium, nodejs, npm and prometheus if missing (nodejs/npm are not
# in deploy/packages.txt: a machine may have its own node); puppeteer-core
# into a cache directory the tier reuses.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$repo/build}
out=$build/browser
cache=${CIRCUITLAB_DEPLOY_CACHE:-$HOME/.cache/circuitlab}/browser
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v promtool >/dev/null || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  echo "browser_test: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$cache" "$out"
if [ ! -d "$cache/node_modules/puppeteer-core" ]; then
  (cd "$cache" && npm init -y >/dev/null && npm install --no-audit --no-fund puppeteer-core@25 >/dev/null 2>&1)
fi
cp "$repo/tests/browser/dashboard_check.cjs" "$repo/tests/browser/browser_util.cjs" "$cache/"

tmp=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "browser_test: FAIL: $*"; [ -f "$tmp/server.log" ] && tail -20 "$tmp/server.log"; exit 1; }

"$build/server/circuitlab-server" --data "$tmp/data" --listen 127.0.0.1:0 --http 127.0.0.1:0 --cpu-slots 2 --max-ensemble 2 \
  >"$tmp/ready" 2>"$tmp/server.log" &
server_pid=$!
for _ in $(seq 100); do grep -q "^http port=" "$tmp/ready" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/^listening port=//p' "$tmp/ready")
url=$(sed -n 's/^http port=[0-9]* url=//p' "$tmp/ready")
[ -n "$port" ] && [ -n "$url" ] || fail "the server did not start"
cli() { "$build/client/circuitlab" --server "127.0.0.1:$port" "$@"; }

# Two runs (a short one and the README's demo), a 2x2 sweep and a decoder,
# trained to the end; then a long one, live.
cli submit "$repo/tests/browser/run.json" >/dev/null
cli submit "$repo/examples/induction.json" >/dev/null   # r2: the demo run, whose heads the attention page draws
cli sweep "$repo/tests/browser/sweep.json" >/dev/null
cli submit "$repo/examples/dice_task_vectors.json" >/dev/null   # r7: a decoder, for its task-vector geometry
for r in r1 r2 r3 r4 r5 r6 r7; do cli watch "$r" >/dev/null || fail "$r did not succeed"; done

scrape() { curl -sf "${url}metrics"; }
scrape >"$tmp/scrape1.txt" || fail "no /metrics"
promtool check metrics <"$tmp/scrape1.txt" || fail "promtool check metrics"
grep -q '^circuitlab_runs_finished_total{result="succeeded"} 7$' "$tmp/scrape1.txt" ||
  fail "runs_finished_total: $(grep runs_finished "$tmp/scrape1.txt")"

cli submit "$repo/tests/browser/live.json" >/dev/null   # r8, trains while the browser looks
node "$cache/dashboard_check.cjs" "$url" "$out" || fail "the dashboard checks"

# One indexing convention (issue 46 item 7): the demo run's heads, named on
# every surface — the CLI's CSV, the HTTP API's JSON, the Python client and
# the dashboard's rendering (heads-dashboard.txt) — as the same (layer, head,
# name) triples, counted from 1.
cli attention r2 --sequences 2 --csv | tail -n +2 | cut -d, -f4-6 | sort -u >"$tmp/heads-cli.txt"
curl -sf "${url}api/v1/runs/r2/attention?sequences=2" | /usr/bin/python3 -c '
import json, sys
a = json.load(sys.stdin)
print("\n".join(sorted({"%d,%d,%s" % (p["layer"], p["head"], p["name"]) for p in a["patterns"]})))' >"$tmp/heads-http.txt"
PYTHONPATH="$repo/client/python" /usr/bin/python3 -c '
import sys, circuitlab
with circuitlab.Client(sys.argv[1]) as c:
    a = c.attention_patterns("r2", sequences=2)
print("\n".join(sorted({"%d,%d,%s" % (p.layer, p.head, p.name) for p in a.patterns})))' "127.0.0.1:$port" >"$tmp/heads-python.txt"
for surface in cli http python; do
  cmp -s "$tmp/heads-$surface.txt" "$out/heads-dashboard.txt" ||
    fail "heads on $surface: $(tr '\n' ' ' <"$tmp/heads-$surface.txt") vs the dashboard's: $(tr '\n' ' ' <"$out/heads-dashboard.txt")"
done
grep -qx '2,1,L2H1' "$out/heads-dashboard.txt" || fail "the induction head is not L2H1 (layer 2, head 1): $(cat "$out/heads-dashboard.txt")"
echo "browser_test: the demo's heads on CLI, HTTP, Python and the dashboard: $(tr '\n' ' ' <"$out/heads-dashboard.txt")"

cli cancel r8 --wait >/dev/null || true
for _ in $(seq 50); do scrape >"$tmp/scrape2.txt"; grep -q 'result="cancelled"} 1$' "$tmp/scrape2.txt" && break; sleep 0.1; done
promtool check metrics <"$tmp/scrape2.txt" || fail "promtool check metrics (second scrape)"
grep -q '^circuitlab_runs_finished_total{result="cancelled"} 1$' "$tmp/scrape2.txt" || fail "the cancelled counter did not move"
grep -q '^circuitlab_http_event_streams 0$' "$tmp/scrape2.txt" || fail "event streams left open: $(grep event_streams "$tmp/scrape2.txt")"
# Reproductions (issue 34): E.4 and E.9 at ci scale, then their pages.
cp "$repo/tests/browser/reproduction_check.cjs" "$cache/"
cli reproduce run E.4 --scale ci --watch >/dev/null || fail "E.4 at ci scale did not pass"
cli reproduce run E.9 --scale ci --watch >/dev/null || fail "E.9 at ci scale did not pass"
# A recipe of one's own with one failing check: `run --watch` exits 3.
rc=0; cli reproduce run --recipe-file "$repo/tests/browser/axis_recipe.json" --scale ci --watch >/dev/null || rc=$?
[ "$rc" = 3 ] || fail "the axis recipe: exit $rc, expected 3 (one check fails)"
node "$cache/reproduction_check.cjs" "$url" "$out" || fail "the reproduction pages"
# A packed sweep (issue 48): two seeds of an IMIR spec at batch 32 pack on a
# CPU slot under --max-ensemble 2 (every sweep above is at batch >= 64, so
# nothing else packed); each run's page names the other.
cp "$repo/tests/browser/packed_check.cjs" "$cache/"
read -r packed_a packed_b < <(cli --json sweep "$repo/tests/browser/packed.json" |
  /usr/bin/python3 -c 'import json, sys; print(" ".join(json.load(sys.stdin)["run_ids"]))')
for id in "$packed_a" "$packed_b"; do cli watch "$id" >/dev/null || fail "the packed run $id did not succeed"; done
grep -q "2 run(s) packed as one ensemble on cpu:[01]: $packed_a,$packed_b" "$tmp/server.log" ||
  fail "$packed_a and $packed_b did not train as one pack: $(grep -i pack "$tmp/server.log" | tail -3)"
node "$cache/packed_check.cjs" "$url" "$out" "$packed_a" "$packed_b" || fail "the packed runs' pages"
echo "browser_test: PASS (screenshots in $out)"
