#!/usr/bin/env bash
# The `cluster` tier (issue 49): circuitlab on a Slurm cluster of separate
# hosts (tests/cluster/cluster_env.sh: slurmctld on `ctl`, the server on
# `srv` with its data hidden from every other host, slurmd on n1 (2 CPUs),
# n2 (2) and n3 (1, its clock 5 min ahead)). Workers reach the server only
# over the cluster network, with TLS and a worker token; users run the CLI
# on `ctl`. Pilots are sized by their node (--slurm-worker-slots 0).
#   1. a 64-run sweep spreads over every node: n1 and n2 pilots train 2 at
#      once, n3's 1; every run ends with exactly a local server's metrics,
#      the skewed node's too, and none lost a lease;
#   2. a node crashes mid-run (its link down, then every process on it
#      SIGKILLed: nothing reaches the server): within the lease timeout the
#      run is queued again, resumes on another node with exactly a local
#      run's metrics, and Slurm's NODE_FAIL of its pilot is logged;
#   3. a node is cut off from the server (iptables in its namespace) past
#      the lease timeout and comes back: the run moves on, the cut-off
#      worker's late reports are refused (fenced), no point is duplicated;
#   4. the server is restarted while pilots train elsewhere: the run ends
#      identical and the pool adopts its pilots;
#   5. GPU pilots on paper: a run whose spec asks for CUDA gets a GPU pilot
#      (--slurm-gpus-per-node 1) on n1 (gres.conf of fake devices), Slurm
#      gives it CUDA_VISIBLE_DEVICES and the worker reports what it was
#      given and that it cannot use it here; every other run trains on the
#      CPU pilots.
#   tests/cluster/cluster_test.sh          (BUILD_DIR: the build, default build/)
#   tests/cluster/cluster_test.sh bench    the 64-run sweep on 1, 2 and 3 nodes (runs/s)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
mode=${1:-test}
build=${BUILD_DIR:-$repo/build}
server_bin=$build/server/circuitlab-server
worker_bin=$build/worker/circuitlab-worker
cli_bin=$build/client/circuitlab
env_sh=$repo/tests/cluster/cluster_env.sh
tmp=$(mktemp -d /tmp/circuitlab-cluster.XXXXXX)
chmod 755 "$tmp"
server_pid=
local_pid=
faketime_lib=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1

say() { echo "cluster_test: $*"; }
fail() {
  say "FAIL: $*"
  [ -f "$d/srv/server.log" ] && { echo "--- server log (tail)"; tail -30 "$d/srv/server.log"; }
  for f in "$d"/shared/logs/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -6 "$f"; }; done
  echo "--- slurmctld log (tail)"; tail -8 "$d/slurmctld.log"
  on ctl sinfo -N; on ctl squeue
  exit 1
}
cleanup() {
  set +e
  if [ -n "${CLUSTER_KEEP:-}" ]; then  # a directory for the logs, kept
    mkdir -p "$CLUSTER_KEEP" && cp -r "$d/shared/logs" "$d/srv/server.log" "$d/slurmctld.log" "$CLUSTER_KEEP/"
  fi
  for pid in $server_pid $local_pid; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  [ -n "${CLUSTER_DIR:-}" ] && "$env_sh" stop "$CLUSTER_DIR"
  rm -rf "$tmp"
}
trap cleanup EXIT

if [ ! -e "$faketime_lib" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends faketime >/dev/null ||
    fail "cannot install faketime"
fi
eval "$("$env_sh" start "$tmp/c")"
d=$CLUSTER_DIR
on() { "$env_sh" on "$@"; }  # (in the background, call "$env_sh" on: $! is then the command's pid)

# TLS for the name the nodes dial; a user's token on the login host, the
# pilots' token and the CA on the shared filesystem.
mkdir -p "$d/srv/data" "$d/login" "$d/shared/logs"
scripts/dev-certs.sh "$d/srv/secrets" srv 10.231.0.3 >/dev/null
scripts/add-principal.sh tester user "$d/srv/secrets/tokens.txt" "$d/login" >/dev/null
scripts/add-principal.sh pilot worker "$d/srv/secrets/tokens.txt" "$d/shared" >/dev/null
cp "$d/srv/secrets/ca.pem" "$d/shared/ca.pem"
chmod 644 "$d/shared/pilot.token"
cli() { on ctl "$cli_bin" --server srv:50051 --ca-cert "$d/shared/ca.pem" --token-file "$d/login/tester.token" "$@"; }
# n3's clock is 5 min ahead: the pilot script (--slurm-extra) preloads libfaketime there.
# Only the wall clock: a skewed host's monotonic clock still runs with its
# kernel's, and a faked one would stretch every timed wait by 5 min.
skew="if [ \"\$SLURMD_NODENAME\" = n3 ]; then export LD_PRELOAD=$faketime_lib FAKETIME=+5m FAKETIME_DONT_FAKE_MONOTONIC=1; fi"

start_server() {  # extra flags
  "$env_sh" on srv "$server_bin" --data "$d/srv/data" --listen 0.0.0.0:50051 --http "" \
    --tls-cert "$d/srv/secrets/server.pem" --tls-key "$d/srv/secrets/server.key" \
    --auth-tokens-file "$d/srv/secrets/tokens.txt" \
    --executor slurm --slurm-worker-slots 0 --slurm-max-workers 3 --slurm-job-name clc --slurm-poll-seconds 1 \
    --slurm-idle-exit 90 --slurm-log-dir "$d/shared/logs" --slurm-extra "$skew" \
    --worker-binary "$worker_bin" --worker-token-file "$d/shared/pilot.token" --worker-ca-cert "$d/shared/ca.pem" \
    --slurm-gpus-per-node 1 --heartbeat-seconds 1 --lease-timeout-seconds 5 --max-ensemble 1 "$@" \
    >>"$d/srv/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    cli --timeout 1 health >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  fail "the server did not come up"
}
pyjson() { /usr/bin/python3 -c "import json,sys; r=json.load(sys.stdin); $1"; }
json() { cli --json show "$1" | pyjson "print($2)"; }
step() { json "$1" 'r["progress"].get("step", 0)'; }
node_of() { json "$1" 'r.get("device", "").split("@")[1].split(" ")[0] if "@" in r.get("device", "") else ""'; }
wait_step() {  # run step -> the node training it
  for _ in $(seq 600); do
    if [ "$(step "$1")" -ge "$2" ]; then
      local n
      n=$(node_of "$1")
      [ -n "$n" ] && { echo "$n"; return 0; }
    fi
    sleep 0.1
  done
  fail "$1 did not reach step $2 on a node"
}
wait_run() {  # run: until it ends; fails unless SUCCEEDED
  cli watch "$1" >/dev/null 2>&1 || fail "$1 did not succeed: $(json "$1" 'r["state"], r.get("error", "")')"
}
spec() {  # name steps -> file
  sed -e "s/\"steps\": 600/\"steps\": $2/" -e "s/induction-demo/$1/" \
    -e 's/"eval_every": 50, "eval_size": 1024, "checkpoint_every": 200/"eval_every": 50, "eval_size": 256, "checkpoint_every": 100/' \
    examples/induction.json >"$d/login/$1.json"
  grep -q '"eval_size": 256' "$d/login/$1.json" || fail "could not shorten $1"
  echo "$d/login/$1.json"
}
sweep_spec() {  # runs -> file: the induction demo at 200 steps, seeds 1..runs
  spec member 200 >/dev/null
  /usr/bin/python3 - "$d/login/member.json" "$1" >"$d/login/sweep.json" <<'EOF'
import json, sys
base = json.load(open(sys.argv[1]))
print(json.dumps({"name": "cluster-sweep", "base": base,
                  "axes": [{"field": "seed", "values": list(range(1, int(sys.argv[2]) + 1))}]}))
EOF
  echo "$d/login/sweep.json"
}
wait_sweep() {  # sweep -> seconds it took from now
  local t0 s
  t0=$(date +%s.%N)
  for _ in $(seq 3000); do
    s=$(cli --json sweep-show "$1" | pyjson 'print(int(r.get("done", False)), r.get("states", {}).get("RUN_STATE_SUCCEEDED", 0))')
    [ "${s%% *}" = 1 ] && break
    sleep 0.2
  done
  [ "${s%% *}" = 1 ] || fail "sweep $1 did not end"
  echo "$(date +%s.%N) $t0"
}

# A local-executor server on this machine's loopback: the reference metrics.
start_local() {
  "$server_bin" --data "$tmp/local" --listen 127.0.0.1:0 --http "" --cpu-slots 2 --max-ensemble 1 >"$tmp/local.log" 2>&1 &
  local_pid=$!
  for _ in $(seq 100); do lport=$(grep -o "port=[0-9]*" "$tmp/local.log" | cut -d= -f2 || true); [ -n "$lport" ] && break; sleep 0.1; done
  lcli=("$cli_bin" --server "127.0.0.1:$lport")
}
same_metrics() {  # remote-run local-run what
  cli metrics "$1" --csv | sed "s/^$1,//" >"$tmp/remote.csv"
  "${lcli[@]}" metrics "$2" --csv | sed "s/^$2,//" >"$tmp/local.csv"
  [ "$(wc -l <"$tmp/local.csv")" -gt 20 ] || fail "too few metric rows for $2"
  cmp -s "$tmp/remote.csv" "$tmp/local.csv" || { diff "$tmp/remote.csv" "$tmp/local.csv" | head -5; fail "$3: $1 != a local run"; }
}

sweep_wall() {  # cli-function -> seconds from submitting the 64-run sweep to its end
  local sid t0 done_
  t0=$(date +%s.%N)
  sid=$("$@" sweep "$(sweep_spec 64)" | grep -o "s[0-9]*" | head -1)
  for _ in $(seq 6000); do
    done_=$("$@" --json sweep-show "$sid" | pyjson 'print(int(r.get("done", False)))')
    [ "$done_" = 1 ] && break
    sleep 0.1
  done
  [ "$done_" = 1 ] || fail "sweep $sid did not end"
  echo "$(date +%s.%N) - $t0" | bc
}

if [ "$mode" = bench ]; then
  # The 64-run sweep (200 steps each) on 1, 2 and 3 nodes (the others
  # drained, the pilots of the last round cancelled), and on local servers
  # with 1 and 2 CPU slots; runs/s, and a lease's cost per run beside a
  # local slot's: (remote wall - local wall) x slots / 64.
  start_server
  declare -A wall=()
  for nodes in n3 n1 n1,n2 n1,n2,n3; do
    on ctl scancel --name=clc 2>/dev/null || true
    for _ in $(seq 300); do [ -z "$(on ctl squeue -h --name=clc)" ] && break; sleep 0.2; done
    for n in n1 n2 n3; do
      if [[ ",$nodes," == *",$n,"* ]]; then on ctl scontrol update nodename="$n" state=resume 2>/dev/null || true
      else on ctl scontrol update nodename="$n" state=drain reason=bench; fi
    done
    wall[$nodes]=$(sweep_wall cli)
  done
  for slots in 1 2; do
    "$server_bin" --data "$tmp/local$slots" --listen 127.0.0.1:0 --http "" --cpu-slots "$slots" --max-ensemble 1 \
      >"$tmp/local$slots.log" 2>&1 &
    local_pid=$!
    for _ in $(seq 100); do lport=$(grep -o "port=[0-9]*" "$tmp/local$slots.log" | cut -d= -f2 || true); [ -n "$lport" ] && break; sleep 0.1; done
    wall[local$slots]=$(sweep_wall "$cli_bin" --server "127.0.0.1:$lport")
    kill "$local_pid"; wait "$local_pid" || true; local_pid=
  done
  echo "| where | slots | 64-run sweep, wall s | runs/s |"
  echo "|---|---|---|---|"
  for k in local1 local2 n3 n1 n1,n2 n1,n2,n3; do
    case $k in local1) slots=1 ;; local2|n1) slots=2 ;; n3) slots=1 ;; n1,n2) slots=4 ;; *) slots=5 ;; esac
    awk -v k="$k" -v s="$slots" -v w="${wall[$k]}" 'BEGIN { printf "| %s | %d | %.1f | %.2f |\n", k, s, w, 64 / w }'
  done
  awk -v r="${wall[n3]}" -v l="${wall[local1]}" -v r2="${wall[n1]}" -v l2="${wall[local2]}" 'BEGIN {
    printf "lease cost per run beside a local slot: %.0f ms (1 slot: n3 vs local), %.0f ms (2 slots: n1 vs local)\n",
      (r - l) * 1000 / 64, (r2 - l2) * 2000 / 64 }'
  exit 0
fi

start_server
start_local
t0=$(date +%s)

# 1. A 64-run sweep over every node; pilots sized by node.
sid=$(cli sweep "$(sweep_spec 64)" | grep -o "s[0-9]*" | head -1)
"${lcli[@]}" sweep "$d/login/sweep.json" >/dev/null
declare -A slots_of=()
for _ in $(seq 3000); do
  while read -r host n; do [ -n "$host" ] && slots_of[$host]=$n; done < <(cli --json workers |
    pyjson 'print("\n".join(w["host"] + " " + str(w.get("slots", 0)) for w in r.get("workers", [])))')
  s=$(cli --json sweep-show "$sid" | pyjson 'print(int(r.get("done", False)))')
  [ "$s" = 1 ] && break
  sleep 0.2
done
[ "$s" = 1 ] || fail "the sweep did not end"
cli --json sweep-show "$sid" | pyjson 'import sys; sys.exit(0 if r["states"].get("RUN_STATE_SUCCEEDED") == 64 else 1)' ||
  fail "not every member succeeded: $(cli --json sweep-show "$sid" | pyjson 'print(r["states"])')"
sweep_s=$(( $(date +%s) - t0 ))
[ "${slots_of[n1]:-}" = 2 ] && [ "${slots_of[n2]:-}" = 2 ] && [ "${slots_of[n3]:-}" = 1 ] ||
  fail "pilots not sized by node: n1 ${slots_of[n1]:-none}, n2 ${slots_of[n2]:-none}, n3 ${slots_of[n3]:-none} slots"
cli --json ls --limit 200 | pyjson '
import collections
runs = r.get("runs", [])
print(" ".join(f"{h}:{n}" for h, n in sorted(collections.Counter(x.get("device", "").split("@")[1].split(" ")[0] for x in runs).items())))
print(max(x.get("attempts", 1) for x in runs))' >"$tmp/spread"
spread=$(head -1 "$tmp/spread")
for n in n1 n2 n3; do [[ " $spread" == *" $n:"* ]] || fail "no run trained on $n ($spread)"; done
[ "$(tail -1 "$tmp/spread")" = 1 ] || fail "a sweep member needed a second attempt (a lease lost: the skewed clock?)"
for _ in $(seq 600); do
  [ "$("${lcli[@]}" --json sweep-show s1 | pyjson 'print(int(r.get("done", False)))')" = 1 ] && break
  sleep 0.2
done
cli metrics --sweep "$sid" --csv >"$tmp/remote.csv"
"${lcli[@]}" metrics --sweep s1 --csv >"$tmp/local.csv"
[ "$(wc -l <"$tmp/local.csv")" -gt 1000 ] || fail "too few metric rows in the local sweep"
cmp -s "$tmp/remote.csv" "$tmp/local.csv" || { diff "$tmp/remote.csv" "$tmp/local.csv" | head -5; fail "the sweep's metrics differ from a local server's"; }
# n3's worker lived 5 min ahead: its log's clock says so.
ahead=$(for f in "$d"/shared/logs/*.out; do
  ts=$(grep -m1 -o "^[0-9-]*T[0-9:]*" "$f" || true)
  [ -n "$ts" ] && echo $(( $(date -d "$ts" +%s) - t0 ))
done | sort -n | tail -1)
[ "${ahead:-0}" -ge 240 ] || fail "no pilot log shows n3's clock 5 min ahead (most ahead: ${ahead:-none} s)"
say "64 runs over n1 n2 n3 ($spread) in $sweep_s s, slots n1 2 n2 2 n3 1, metrics identical to a local server; n3's clock +${ahead} s, no lease lost"

# 2. A node crashes mid-run.
long=$(spec long 8000)
run=$(cli submit "$long" | grep -o "r[0-9]*" | head -1)
"${lcli[@]}" submit "$long" >/dev/null
lrun=r65
node=$(wait_step "$run" 300)
"$env_sh" kill "$node"
# Nothing tells the server: the lease timeout (5 s) does, well before the
# kernel would give the connection up (gRPC's TCP_USER_TIMEOUT, 20 s).
c0=$(date +%s%N)
for _ in $(seq 300); do [ "$(json "$run" 'r["attempts"]')" -ge 2 ] && break; sleep 0.1; done
moved_ms=$(( ($(date +%s%N) - c0) / 1000000 ))
[ "$moved_ms" -le 15000 ] || fail "$run was given to another node $moved_ms ms after $node crashed (lease timeout 5 s)"
wait_run "$run"
[ "$(json "$run" 'r["attempts"]')" -ge 2 ] || fail "$run should have two attempts"
[ "$(node_of "$run")" != "$node" ] || fail "$run finished on the crashed node"
"${lcli[@]}" watch "$lrun" >/dev/null 2>&1 || fail "local $lrun"
same_metrics "$run" "$lrun" "after a node crash"
for _ in $(seq 450); do grep -q "NODE_FAIL" "$d/srv/server.log" && break; sleep 0.2; done
grep -q "NODE_FAIL" "$d/srv/server.log" || fail "the pool did not log its pilot's NODE_FAIL"
"$env_sh" boot "$node"
say "$node crashed at step >= 300 of $run: queued again after $moved_ms ms, resumed on $(node_of "$run"), identical to a local run; NODE_FAIL logged"

# 3. A node cut off from the server past the lease timeout, then back.
run=$(cli submit "$long" | grep -o "r[0-9]*" | head -1)
node=$(wait_step "$run" 300)
on "$node" iptables -A INPUT -s 10.231.0.3 -j DROP
on "$node" iptables -A OUTPUT -d 10.231.0.3 -j DROP
for _ in $(seq 300); do [ "$(json "$run" 'r["attempts"]')" -ge 2 ] && break; sleep 0.1; done
[ "$(json "$run" 'r["attempts"]')" -ge 2 ] || { on "$node" iptables -F; fail "$run was not handed on while $node was cut off"; }
# Back before the worker's own timeout (twice the lease's): it still holds
# the lease the server gave up, and says so when its reports reach it.
on "$node" iptables -F
wait_run "$run"
[ "$(node_of "$run")" != "$node" ] || fail "$run finished on the cut-off node"
same_metrics "$run" "$lrun" "after a partition"
for _ in $(seq 100); do grep -qs "$run stopped (.*), not reported" "$d"/shared/logs/*.out && break; sleep 0.2; done
grep -qs "$run stopped (.*), not reported" "$d"/shared/logs/*.out || fail "the cut-off worker did not give its lease up"
say "$node cut off from srv mid-run: $run moved to $(node_of "$run"), the late worker fenced, metrics identical, no duplicates"

# 4. The server restarted while pilots train elsewhere.
run=$(cli submit "$long" | grep -o "r[0-9]*" | head -1)
node=$(wait_step "$run" 300)
kill -TERM "$server_pid"
wait "$server_pid" || fail "the server did not drain cleanly (exit $?)"
server_pid=
start_server
wait_run "$run"
same_metrics "$run" "$lrun" "after a server restart"
pilots=$(on ctl squeue -h --name=clc | wc -l)
[ "$pilots" -le 3 ] || fail "$pilots pilots after the restart (the pool should adopt, not add)"
say "server restarted while $run trained on $node: it ended identical; $pilots pilot(s) in the queue"

# 5. GPU pilots on paper: a run whose spec asks for CUDA gets a GPU pilot
# (--slurm-gpus-per-node 1, job name clc-gpu) on n1, the node with GPUs in
# gres.conf; the other runs above trained on CPU pilots. The CPU pilots,
# idle now, leave n1 free.
on ctl scancel --name=clc
for _ in $(seq 100); do [ -z "$(on ctl squeue -h --name=clc)" ] && break; sleep 0.2; done
sed 's/"tags": \["demo", "imir-2L"\],/"tags": ["demo"], "resources": {"device": "DEVICE_KIND_CUDA"},/' \
  "$(spec gpu 100)" >"$d/login/gpu-cuda.json"
grep -q DEVICE_KIND_CUDA "$d/login/gpu-cuda.json" || fail "could not ask for CUDA in the spec"
run=$(cli submit "$d/login/gpu-cuda.json" | grep -o "r[0-9]*" | head -1)
for _ in $(seq 300); do grep -qs "is not available" "$d"/shared/logs/clc-gpu-*.out && break; sleep 0.2; done
log=$(grep -ls "is not available" "$d"/shared/logs/clc-gpu-*.out | head -1 || true)
[ -n "$log" ] || fail "no GPU pilot ran for $run"
grep -Eq "given CUDA_VISIBLE_DEVICES=[01] \(SLURM_JOB_GPUS=[01]\)" "$log" || { cat "$log"; fail "the GPU pilot's worker did not report the GPU Slurm gave it"; }
grep -q "cuda:0 is not available" "$log" || fail "the worker did not say it cannot use the GPU here"
job=$(basename "$log" .out)
job=${job#clc-gpu-}
on ctl scontrol show job "$job" >"$tmp/gpu-job"
grep -q "TresPerNode=.*gpu:1" "$tmp/gpu-job" || fail "pilot $job did not ask Slurm for gpu:1"
grep -q "NodeList=n1" "$tmp/gpu-job" || fail "pilot $job did not land on n1, the GPU node"
[ "$(json "$run" 'r["state"]')" = RUN_STATE_QUEUED ] || fail "$run should wait for a GPU worker: $(json "$run" 'r["state"]')"
cli cancel "$run" >/dev/null
say "$run asks for CUDA: GPU pilot $job with gpu:1 on n1, $(grep -o "given CUDA_VISIBLE_DEVICES=[^;]*" "$log" | head -1); the worker refused (CPU-only LibTorch), the run waits"
say "PASS in $(( $(date +%s) - t0 )) s"
