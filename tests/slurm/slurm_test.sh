#!/usr/bin/env bash
# The `slurm` tier (issue 17): a real single-node Slurm (tests/slurm/slurm_env.sh)
# and a server on --executor slurm with TLS and tokens, driven from the CLI:
#   1. six runs train in Slurm pilot jobs (seen in squeue under the pool's job
#      name, at most --slurm-max-workers of them) and end with exactly the
#      metrics of a local-executor server;
#   2. `scancel --signal=USR2 --batch` of a pilot mid-run: the worker hands the
#      run back (checkpoint), it resumes on another pilot, identical metrics;
#   3. `kill -9` of a worker mid-run: the lease is lost, the run resumes,
#      identical metrics;
#   4. the server restarted (SIGTERM) while a pilot trains: the worker hands
#      the run back, dials the new server, the run ends identical, nothing
#      lost or duplicated;
#   5. cancelling a run stops it on its worker within seconds;
#   6. a worker that cannot reach the server, or has the wrong role, exits
#      non-zero with a clear message.
#   tests/slurm/slurm_test.sh      (BUILD_DIR: the build, default build/)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
build=${BUILD_DIR:-$repo/build}
server_bin=$build/server/circuitlab-server
worker_bin=$build/worker/circuitlab-worker
cli_bin=$build/client/circuitlab
tmp=$(mktemp -d)
chmod 755 "$tmp"  # munged (user munge) keeps its socket below
slurm_dir=$tmp/slurm
server_pid=
local_pid=

say() { echo "slurm_test: $*"; }
fail() {
  say "FAIL: $*"
  [ -f "$tmp/server.log" ] && { echo "--- server log (tail)"; tail -30 "$tmp/server.log"; }
  for f in "$tmp"/logs/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -8 "$f"; }; done
  exit 1
}
cleanup() {
  set +e
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  [ -n "$local_pid" ] && kill "$local_pid" 2>/dev/null && wait "$local_pid" 2>/dev/null
  if [ -n "${SLURM_CONF:-}" ]; then
    scancel --name=cltest 2>/dev/null
    sleep 0.5
  fi
  pkill -9 -f "$worker_bin" 2>/dev/null
  tests/slurm/slurm_env.sh stop "$slurm_dir"
  rm -rf "$tmp"
}
trap cleanup EXIT

env_line=$(tests/slurm/slurm_env.sh start "$slurm_dir") || fail "could not start Slurm"
eval "$env_line"

scripts/dev-certs.sh "$tmp/secrets" >/dev/null
scripts/add-principal.sh tester user "$tmp/secrets/tokens.txt" "$tmp" >/dev/null
scripts/add-principal.sh pilot worker "$tmp/secrets/tokens.txt" "$tmp" >/dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cli=("$cli_bin" --server "127.0.0.1:$port" --ca-cert "$tmp/secrets/ca.pem" --token-file "$tmp/tester.token")

start_server() {
  "$server_bin" --data "$tmp/data" --listen "127.0.0.1:$port" --http "" \
    --tls-cert "$tmp/secrets/server.pem" --tls-key "$tmp/secrets/server.key" \
    --auth-tokens-file "$tmp/secrets/tokens.txt" --audit-log "$tmp/audit.jsonl" \
    --executor slurm --slurm-max-workers 2 --slurm-job-name cltest --slurm-poll-seconds 1 --slurm-idle-exit 30 \
    --slurm-log-dir "$tmp/logs" --slurm-extra "#SBATCH --comment=circuitlab-slurm-test" \
    --worker-binary "$worker_bin" --worker-token-file "$tmp/pilot.token" --worker-ca-cert "$tmp/secrets/ca.pem" \
    --heartbeat-seconds 1 --lease-timeout-seconds 8 >>"$tmp/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    "${cli[@]}" --timeout 1 health >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  fail "the server did not come up"
}
json() { "${cli[@]}" --json show "$1" | python3 -c "import json,sys; r=json.load(sys.stdin); print($2)"; }
step() { json "$1" 'r["progress"].get("step", 0)'; }
wait_step() {  # run, step: until the run is past `step` on a worker
  for _ in $(seq 600); do
    [ "$(step "$1")" -ge "$2" ] && [[ "$(json "$1" 'r.get("device", "")')" == *slurm:* ]] && return 0
    sleep 0.1
  done
  fail "$1 did not reach step $2 on a pilot"
}
# The Slurm job (e.g. 12 or 12_1) of the pilot training a run.
job_of() { json "$1" 'r["device"].split("slurm:")[1].split("@")[0]'; }

spec() {  # name seed steps -> file
  sed -e "s/\"steps\": 600/\"steps\": $3/" -e 's/"checkpoint_every": 200/"checkpoint_every": 100/' \
    -e "s/induction-demo/$1/" -e "s/\"seed\": 7,/\"seed\": $2,/" examples/induction.json >"$tmp/$1.json"
  grep -q "\"seed\": $2," "$tmp/$1.json" || fail "could not set the seed of $1"
  echo "$tmp/$1.json"
}

start_server
t0=$(date +%s)

# 1. Six runs through the CLI on Slurm pilots.
specs=()
for i in 1 2 3 4 5 6; do specs+=("$(spec "six$i" $((10 + i)) 300)"); done
for s in "${specs[@]}"; do "${cli[@]}" submit "$s" >/dev/null; done
max_pilots=0
seen_in_squeue=0
for _ in $(seq 900); do
  n=$(squeue -h --name=cltest -t RUNNING,PENDING,CONFIGURING,COMPLETING | wc -l)
  [ "$n" -gt "$max_pilots" ] && max_pilots=$n
  [ "$n" -gt 0 ] && seen_in_squeue=1
  done_count=$("${cli[@]}" ls --state succeeded | grep -c "^r" || true)
  [ "$done_count" -ge 6 ] && break
  sleep 0.2
done
[ "$done_count" -ge 6 ] || { "${cli[@]}" ls; fail "six runs did not all succeed"; }
[ "$seen_in_squeue" = 1 ] || fail "no pilot named cltest was seen in squeue"
[ "$max_pilots" -le 2 ] || fail "$max_pilots pilots at once (--slurm-max-workers 2)"
for r in r1 r2 r3 r4 r5 r6; do
  [[ "$(json "$r" 'r["device"]')" == *slurm:* ]] || fail "$r did not train on a pilot: $(json "$r" 'r["device"]')"
done
scontrol show job "$(job_of r1)" 2>/dev/null | grep "Comment=circuitlab-slurm-test" >/dev/null ||
  sacct -c --parsable2 --noheader -X --format=JobName | grep cltest >/dev/null || fail "pilot job not found by name"
say "6 runs SUCCEEDED on Slurm pilots (at most $max_pilots at once) in $(( $(date +%s) - t0 )) s"

# 2. A pilot signalled USR2 (what --signal=B:USR2@120 does before its end).
# Long enough (~13 s on a quiet core) that it is still training when the
# checks below look at it on a loaded machine: at 1500 steps it once ended
# between wait_step and `circuitlab workers`.
long_spec=$(spec long 7 5000)
"${cli[@]}" submit "$long_spec" >/dev/null  # r7
wait_step r7 300
job=$(job_of r7)
"${cli[@]}" workers | grep "^executor slurm" >/dev/null || fail "circuitlab workers: not the slurm executor"
"${cli[@]}" workers | grep -E "slurm:$job .* r7" >/dev/null || { "${cli[@]}" workers; fail "circuitlab workers does not show r7 on $job"; }
scancel --signal=USR2 --batch "$job"
"${cli[@]}" watch r7 >/dev/null || fail "r7 did not succeed after its pilot was signalled"
[ "$(json r7 'r["attempts"]')" -ge 2 ] || fail "r7 should have two attempts"
[[ "$(json r7 'r["device"]')" != *"slurm:$job@"* ]] || fail "r7 finished on the pilot that was told to leave"
grep -q "draining (SIGUSR2" "$tmp"/logs/cltest-"${job/_*/}"*.out || fail "the pilot's log does not show the drain"
say "USR2 to pilot $job: r7 handed back and finished on another pilot"

# 3. kill -9 of a worker.
"${cli[@]}" submit "$long_spec" >/dev/null  # r8
wait_step r8 300
job=$(job_of r8)
pkill -9 -f -- "--engine-job slurm:$job( |$)" || fail "no worker process for job $job"
"${cli[@]}" watch r8 >/dev/null || fail "r8 did not succeed after its worker was killed"
[ "$(json r8 'r["attempts"]')" -ge 2 ] || fail "r8 should have two attempts"
say "kill -9 of the worker of job $job: r8 resumed and finished"

# 4. The server restarted while a pilot trains.
"${cli[@]}" submit "$long_spec" >/dev/null  # r9
wait_step r9 300
kill -TERM "$server_pid"
wait "$server_pid" || fail "the server did not drain cleanly (exit $?)"
server_pid=
start_server
"${cli[@]}" watch r9 >/dev/null || fail "r9 did not succeed after the server restarted"
grep -q "registered with" "$tmp"/logs/*.out || fail "no worker registered"
pilots=$(squeue -h --name=cltest | wc -l)
[ "$pilots" -le 2 ] || fail "$pilots pilots after the restart (the pool should adopt, not add)"
say "server restarted mid-run: r9 finished; $pilots pilot(s) in the queue"

# 5. Cancel reaches the worker.
"${cli[@]}" submit "$long_spec" >/dev/null  # r10
wait_step r10 100
c0=$(date +%s%N)
"${cli[@]}" cancel r10 >/dev/null
for _ in $(seq 100); do [ "$(json r10 'r["state"]')" = RUN_STATE_CANCELLED ] && break; sleep 0.1; done
[ "$(json r10 'r["state"]')" = RUN_STATE_CANCELLED ] || fail "r10 not cancelled within 10 s"
cancel_ms=$(( ($(date +%s%N) - c0) / 1000000 ))
[ "$(step r10)" -lt 5000 ] || fail "r10 ran to the end"
say "cancel of r10 took effect on its worker in $cancel_ms ms"

# 1-4: the same specs on a local-executor server give the same metrics.
"$server_bin" --data "$tmp/local" --listen 127.0.0.1:0 --http "" --cpu-slots 2 >"$tmp/local.log" 2>&1 &
local_pid=$!
for _ in $(seq 100); do lport=$(grep -o "port=[0-9]*" "$tmp/local.log" | cut -d= -f2 || true); [ -n "$lport" ] && break; sleep 0.1; done
lcli=("$cli_bin" --server "127.0.0.1:$lport")
for s in "${specs[@]}" "$long_spec"; do "${lcli[@]}" submit "$s" >/dev/null; done  # r1..r7 there
for r in r1 r2 r3 r4 r5 r6 r7; do "${lcli[@]}" watch "$r" >/dev/null || fail "local $r"; done
for pair in r1:r1 r2:r2 r3:r3 r4:r4 r5:r5 r6:r6 r7:r7 r8:r7 r9:r7; do
  remote=${pair%:*} here=${pair#*:}
  "${cli[@]}" metrics "$remote" --csv | sed "s/^$remote,//" >"$tmp/remote.csv"
  "${lcli[@]}" metrics "$here" --csv | sed "s/^$here,//" >"$tmp/local.csv"
  [ "$(wc -l <"$tmp/local.csv")" -gt 20 ] || fail "too few metric rows for $here"
  cmp -s "$tmp/remote.csv" "$tmp/local.csv" || { diff "$tmp/remote.csv" "$tmp/local.csv" | head -5; fail "$remote on Slurm != $here on a local server"; }
done
for r in r1 r7; do  # the IMIR coordinates (the basis travels in parts) too
  "${cli[@]}" coords "$r" --csv >"$tmp/remote.csv"
  "${lcli[@]}" coords "$r" --csv >"$tmp/local.csv"
  [ "$(wc -l <"$tmp/local.csv")" -gt 10 ] || fail "too few coordinate rows for $r"
  cmp -s "$tmp/remote.csv" "$tmp/local.csv" || { diff "$tmp/remote.csv" "$tmp/local.csv" | head -5; fail "$r's coordinates differ"; }
done
say "metrics identical to a local-executor server: 6 runs, the USR2-preempted, the kill -9'd, the restarted; coordinates too"

# 6. Workers that cannot work.
set +e
out=$("$worker_bin" --server 127.0.0.1:1 --connect-timeout 2 2>&1); rc=$?
set -e
[ "$rc" = 2 ] || fail "an unreachable server should exit 2, got $rc"
grep -q "cannot reach the server at 127.0.0.1:1" <<<"$out" || fail "unclear message: $out"
set +e
out=$("$worker_bin" --server "127.0.0.1:$port" --ca-cert "$tmp/secrets/ca.pem" --token-file "$tmp/tester.token" \
  --connect-timeout 5 2>&1); rc=$?
set -e
[ "$rc" = 4 ] || fail "a worker with a user's token should exit 4, got $rc: $out"
grep -q "workers need the worker (or admin) role" <<<"$out" || fail "unclear message: $out"
grep '"method":"Register"' "$tmp/audit.jsonl" | grep '"principal":"pilot".*"outcome":"OK"' >/dev/null ||
  fail "no audit line for a pilot's Register"
grep '"method":"Register"' "$tmp/audit.jsonl" | grep '"principal":"tester".*"outcome":"PERMISSION_DENIED"' >/dev/null ||
  fail "no audit line for the refused worker"
say "unreachable server: exit 2; a user's token: exit 4 ($(tail -1 <<<"$out" | cut -c1-100))"
say "PASS in $(( $(date +%s) - t0 )) s"
