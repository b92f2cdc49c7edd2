#!/usr/bin/env bash
# The GPU check (issue 35): proves on a machine with NVIDIA GPUs, in a few
# minutes, that circuitlab built against a CUDA LibTorch trains on them.
# One line per check, PASS or FAIL; exits 1 on any failure.
#
#   scripts/gpu-check.sh                         # with an existing CUDA build in build-gpu/
#   CMAKE_PREFIX_PATH=/opt/libtorch scripts/gpu-check.sh --build
#                                                # configure and build build-gpu/ first (a
#                                                # pytorch.org LibTorch, or a pip torch's:
#                                                # python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
#   scripts/gpu-check.sh --cpu                   # the same sequence on CPU slots (tested in CI)
#
# Checks:
#   devices     the server reports the CUDA devices LibTorch sees, one slot each
#   placement   one CUDA run per device at once, each on its own cuda:N
#   train       those runs succeed with evaluation metrics
#   resume      a CUDA run stopped mid-way (SIGTERM: checkpoint) resumes on a
#               restarted server and ends with the metrics of an uninterrupted
#               one (equal to 1e-6: deterministic CUDA kernels are the default)
#   coords      IMIR coordinates were recorded while it trained on the GPU
#   analyses    ProjectCheckpoint and an Intervene job read its GPU checkpoint
#               (analysis jobs run on the server's CPU analysis workers)
#   agreement   the README demo trained on the GPU and on the CPU ends within
#               0.03 in every evaluation accuracy and 10% in every evaluation
#               loss (float32 on different kernels; the CPU uses its own
#               IMIR kernel, the GPU LibTorch's)
# Environment: BUILD_DIR (default build-gpu, or build with --cpu), KEEP=1
# keeps the data folder and logs (printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=cuda build_first=0
for a in "$@"; do
  case $a in
    --cpu) mode=cpu ;;
    --build) build_first=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done
build=${BUILD_DIR:-$([ $mode = cpu ] && echo build || echo build-gpu)}
work=$(mktemp -d)
server_pid=
failed=0
pass() { printf 'PASS %-10s %s\n' "$1" "$2"; }
fail() { printf 'FAIL %-10s %s\n' "$1" "$2"; failed=1; }
stop_server() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; server_pid=; }
finish() {
  stop_server
  # A failed check shows the server's last words (a server that went away
  # mid-check left only "failed to connect" in the client's output).
  if [ $failed != 0 ] && [ -s "$work/server.log" ]; then
    echo "gpu-check: the server log's last lines:"
    tail -30 "$work/server.log"
  fi
  if [ "${KEEP:-0}" = 1 ]; then echo "gpu-check: data and logs kept in $work"; else rm -rf "$work"; fi
}
trap finish EXIT

if [ $build_first = 1 ]; then
  echo "gpu-check: building $build (CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-unset})"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCIRCUITLAB_TESTS=OFF -DCIRCUITLAB_BENCH=OFF \
    >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log"; exit 1; }
  cmake --build "$build" --target circuitlab-server circuitlab >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; exit 1; }
fi
server_bin=$build/server/circuitlab-server
cli_bin=$build/client/circuitlab
[ -x "$server_bin" ] && [ -x "$cli_bin" ] || { echo "gpu-check: no binaries in $build (use --build)" >&2; exit 2; }

# start_server DATA: the server on a free loopback port, CUDA slots (or, with
# --cpu, two CPU slots and no CUDA).
start_server() {
  local flags=(--data "$1" --listen 127.0.0.1:0 --http "" --cpu-slots 1)
  [ $mode = cpu ] && flags=(--data "$1" --listen 127.0.0.1:0 --http "" --cpu-slots 2 --no-cuda)
  "$server_bin" "${flags[@]}" >"$work/server.out" 2>>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 300); do grep -q '^listening port=' "$work/server.out" 2>/dev/null && break; sleep 0.1; done
  port=$(sed -n 's/^listening port=//p' "$work/server.out")
  [ -n "$port" ] || { tail -20 "$work/server.log"; echo "gpu-check: the server did not start" >&2; exit 1; }
  cli=("$cli_bin" --server "127.0.0.1:$port")
}
# spec NAME STEPS DEVICE_KIND [SEED]: the README demo, renamed, resized, placed.
spec() {
  sed -e "s/\"name\": \"[^\"]*\"/\"name\": \"$1\"/" -e "s/\"steps\": 600/\"steps\": $2/" \
    -e "s/\"checkpoint_every\": 200/\"checkpoint_every\": 100/" \
    -e "s/^{/{\"resources\": {\"device\": \"$3\"},/" ${4:+-e "s/\"seed\": [0-9]*/\"seed\": $4/"} \
    examples/induction.json >"$work/$1.json"
  echo "$work/$1.json"
}
# Fields of `circuitlab --json show RUN` (protobuf's JSON, one space per
# level): the run's own state and device, its progress step.
show_field() { "${cli[@]}" --json show "$1" 2>/dev/null | sed -n "s/^$2\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}\$/\1/p" | head -1; }
state_of() { show_field "$1" ' "state": '; }
device_of() { show_field "$1" ' "device": '; }
step_of() { show_field "$1" '  "step": '; }
wait_end() {  # RUN
  for _ in $(seq 3000); do
    case $(state_of "$1") in RUN_STATE_SUCCEEDED | RUN_STATE_FAILED | RUN_STATE_CANCELLED) return 0 ;; esac
    sleep 0.2
  done
}
# Final evaluation metrics of a run: "name value" lines, sorted.
final_eval() {
  "${cli[@]}" metrics "$1" --csv | awk -F, '$2 ~ /^eval\// { v[$2] = $4 } END { for (k in v) print k, v[k] }' | sort
}

kind=DEVICE_KIND_CUDA
[ $mode = cpu ] && kind=DEVICE_KIND_CPU
start_server "$work/data"

# devices
health=$("${cli[@]}" health 2>&1)
info=$(tail -1 <<<"$health")
devices=$(grep -o '[0-9]* CUDA device' <<<"$info" | grep -o '^[0-9]*')
slots=$(sed -n 's/.*, slots //p' <<<"$info")
if [ $mode = cpu ]; then
  want_slots=2
  [ -n "$devices" ] && pass devices "CPU mode: $info" || fail devices "$health"
else
  want_slots=${devices:-0}
  if [ "${devices:-0}" -ge 1 ] && [ "$(tr ',' '\n' <<<"$slots" | grep -c '^cuda:')" = "$devices" ]; then
    pass devices "$info"
  else
    fail devices "no CUDA device, or not one slot per device: $info (is LibTorch built with CUDA? nvidia-smi?)"
    exit 1
  fi
fi

# placement and train: one run per device (slot), at once.
runs=()
for i in $(seq "$want_slots"); do
  out=$("${cli[@]}" submit "$(spec "place$i" 3000 "$kind" "$i")") || fail placement "submit: $out"
  runs+=("$(grep -o 'r[0-9]*' <<<"$out" | head -1)")
done
sleep 1
seen=()
for r in "${runs[@]}"; do seen+=("$(device_of "$r")"); done
distinct=$(printf '%s\n' "${seen[@]}" | sort -u | grep -c .)
if [ "$distinct" = "$want_slots" ] && ! printf '%s\n' "${seen[@]}" | grep -qv "^${mode}:"; then
  pass placement "${runs[*]} on ${seen[*]}"
else
  fail placement "runs ${runs[*]} on '${seen[*]}' (want $want_slots distinct $mode:N slots)"
fi
ok=1
for r in "${runs[@]}"; do
  wait_end "$r"
  [ "$(state_of "$r")" = RUN_STATE_SUCCEEDED ] && [ -n "$(final_eval "$r")" ] || ok=0
done
[ $ok = 1 ] && pass train "${#runs[@]} run(s) succeeded with evaluation metrics" ||
  fail train "$(for r in "${runs[@]}"; do echo "$r $(state_of "$r")"; done | paste -sd ' ')"

# resume: stopped mid-way by SIGTERM, resumed by a restarted server, compared
# with the same spec trained without a stop.
out=$("${cli[@]}" submit "$(spec resume 1500 "$kind" 7)")
stopped=$(grep -o 'r[0-9]*' <<<"$out" | head -1)
for _ in $(seq 3000); do [ "$(step_of "$stopped")" -ge 400 ] 2>/dev/null && break; sleep 0.05; done
at=$(step_of "$stopped")
stop_server
start_server "$work/data"
out=$("${cli[@]}" submit "$(spec straight 1500 "$kind" 7)")
straight=$(grep -o 'r[0-9]*' <<<"$out" | head -1)
wait_end "$stopped"
wait_end "$straight"
attempts=$("${cli[@]}" show "$stopped" | grep -o 'attempts [0-9]*')
diff=$(paste -d' ' <(final_eval "$stopped") <(final_eval "$straight") |
  awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d } END { print m + 0 }')
if [ "$(state_of "$stopped")" = RUN_STATE_SUCCEEDED ] && [ "$attempts" = "attempts 2" ] &&
  awk -v d="$diff" 'BEGIN { exit !(d <= 1e-6) }'; then
  pass resume "$stopped stopped at step $at on $(device_of "$stopped"), resumed, largest difference to $straight: $diff"
else
  fail resume "$stopped: $(state_of "$stopped"), $attempts, stopped at step $at, largest difference to $straight: $diff"
fi

# coords and analyses on the GPU run's checkpoints.
n=$("${cli[@]}" coords "$stopped" --csv | tail -n +2 | wc -l)
[ "$n" -gt 0 ] && pass coords "$n coordinate values recorded while $stopped trained" || fail coords "none for $stopped"
project=$("${cli[@]}" project "$stopped" 2>&1) && grep -q "rho " <<<"$project" &&
  intervene=$("${cli[@]}" intervene "$stopped" --zero beta 2>&1) &&
  pass analyses "ProjectCheckpoint and Intervene on $stopped's checkpoint" ||
  fail analyses "$(tail -3 <<<"${intervene:-$project}")"

# agreement: the README demo on this device and on the CPU.
out=$("${cli[@]}" submit "$(spec demo_$mode 600 "$kind")")
here=$(grep -o 'r[0-9]*' <<<"$out" | head -1)
out=$("${cli[@]}" submit "$(spec demo_cpu 600 DEVICE_KIND_CPU)")
cpu=$(grep -o 'r[0-9]*' <<<"$out" | head -1)
wait_end "$here"
wait_end "$cpu"
worst=$(paste -d' ' <(final_eval "$here") <(final_eval "$cpu") | awk '
  $1 != $3 { print "mismatched metrics " $1 " " $3; exit }
  { d = $2 - $4; if (d < 0) d = -d
    if ($1 ~ /accuracy$/ && d > 0.03) { print $1 ": " $2 " vs " $4; exit }
    if ($1 ~ /loss$/ && d > 0.1 * ($4 < 0 ? -$4 : $4) + 1e-3) { print $1 ": " $2 " vs " $4; exit } }')
acc_here=$(final_eval "$here" | awk '$1 == "eval/icl_rare/accuracy" { print $2 }')
acc_cpu=$(final_eval "$cpu" | awk '$1 == "eval/icl_rare/accuracy" { print $2 }')
if [ -z "$worst" ] && [ -n "$acc_here" ]; then
  pass agreement "$here on $(device_of "$here") vs $cpu on $(device_of "$cpu"): icl_rare accuracy $acc_here vs $acc_cpu"
else
  fail agreement "${worst:-no metrics}"
fi

[ $failed = 0 ] && echo "gpu-check: all checks passed" || echo "gpu-check: FAILED"
exit $failed
