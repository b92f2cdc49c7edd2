#!/usr/bin/env bash
# The `cuda-build` tier (issue 35): the checkout built against a CUDA LibTorch
# (Debian 13's libtorch-cuda-dev 2.6 with nvidia-cuda-toolkit 12.4, in
# tests/debian13/root.sh's cuda root, with deploy/cuda-placeholders.sh's
# stand-ins for cuDNN and the driver), on a machine without a GPU:
#   1. it configures (CMake finds CUDA and the CUDA LibTorch), compiles with
#      -Werror and links the server, CLI, worker and the e2e tier;
#   2. the server starts, links libtorch_cuda, logs and reports (health) a
#      CUDA build with 0 CUDA devices, and trains on its CPU slot; a run that
#      asks for CUDA is refused, naming the field; a worker asked for cuda:0
#      refuses to start;
#   3. the e2e tier passes on that build.
# The installed binaries are left in the root (/build/install) for the CUDA
# image (tests/deploy/cuda_image_test.sh). What a real GPU host runs instead:
# scripts/gpu-check.sh (docs/howto/debian-and-gpus.md).
#   tests/debian13/cuda_build_test.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "cuda_build_test: $*"; }

t0=$SECONDS
"$here/root.sh" prepare cuda >/dev/null
say "root ready in $((SECONDS - t0)) s"
t1=$SECONDS
"$here/root.sh" run cuda bash -c '
  set -euo pipefail
  say() { echo "cuda_build_test: $*"; }
  say "$(g++ --version | head -1); $(dpkg-query -W -f="libtorch-cuda-dev \${Version}, " libtorch-cuda-dev)$(nvcc --version | tail -1)"
  # The build tree stays in the root between runs; a run from another
  # checkout starts it again (ninja compares times, and another checkout'"'"'s
  # older files would look up to date against this one'"'"'s outputs).
  if [ "$(cat /build/.checkout 2>/dev/null)" != "'"$(cd "$here/../.." && pwd)"'" ]; then rm -rf /build/* /build/.checkout; fi
  mkdir -p /build && echo "'"$(cd "$here/../.." && pwd)"'" >/build/.checkout
  cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCIRCUITLAB_BENCH=OFF >/tmp/configure.log 2>&1 ||
    { cat /tmp/configure.log; exit 1; }
  grep -q "^CUDA_CUDART_LIBRARY:FILEPATH=/" /build/CMakeCache.txt ||
    { cat /tmp/configure.log; say "FAIL: CMake did not find the CUDA runtime"; exit 1; }
  cmake --build /build --target circuitlab-server circuitlab circuitlab-worker e2e_tests
  cmake --install /build --prefix /build/install >/dev/null'
say "built in $((SECONDS - t1)) s"

t2=$SECONDS
"$here/root.sh" run cuda bash -c '
  set -euo pipefail
  say() { echo "cuda_build_test: $*"; }
  fail() { say "FAIL: $*"; [ -f /tmp/cuda-server.log ] && tail -20 /tmp/cuda-server.log; exit 1; }
  bin=/build/install/bin
  ldd $bin/circuitlab-server | grep "libtorch_cuda.so" >/dev/null || fail "the server does not link libtorch_cuda.so"
  ldd $bin/circuitlab-server | grep "not found" >/dev/null && { ldd $bin/circuitlab-server | grep "not found"; fail "unresolved libraries"; }
  data=$(mktemp -d)
  $bin/circuitlab-server --data "$data" --listen 127.0.0.1:0 --http "" >/tmp/cuda-server.out 2>/tmp/cuda-server.log &
  pid=$!
  trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf $data" EXIT
  for _ in $(seq 100); do grep -q "^listening port=" /tmp/cuda-server.out && break; sleep 0.1; done
  port=$(sed -n "s/^listening port=//p" /tmp/cuda-server.out)
  [ -n "$port" ] || fail "the server did not start"
  grep -q "LibTorch 2.6.0 (CUDA 12.4), 0 CUDA devices: no CUDA device or driver found, runs train on the CPU slots" \
    /tmp/cuda-server.log || fail "no start-up line naming the CUDA build and its 0 devices"
  cli=("$bin/circuitlab" --server "127.0.0.1:$port")
  health=$("${cli[@]}" health)
  grep -q "LibTorch 2.6.0 (CUDA 12.4), 0 CUDA devices, slots cpu:0" <<<"$health" || { echo "$health"; fail "health"; }
  say "health: $(tail -1 <<<"$health")"
  sed -e "s/\"steps\": 600/\"steps\": 60/" -e "s/\"checkpoint_every\": 200/\"checkpoint_every\": 30/" \
    /src/examples/induction.json >/tmp/short.json
  out=$("${cli[@]}" submit /tmp/short.json --watch) || { echo "$out"; fail "the demo on the CPU slot"; }
  grep -q "^r1 SUCCEEDED" <<<"$out" || { echo "$out"; fail "r1 did not succeed"; }
  "${cli[@]}" show r1 | grep "cpu:0" >/dev/null || fail "r1 did not train on cpu:0"
  sed "s/\"seed\"/\"resources\": {\"device\": \"DEVICE_KIND_CUDA\"}, \"seed\"/" /tmp/short.json >/tmp/cuda.json
  refused=$("${cli[@]}" submit /tmp/cuda.json 2>&1) && { echo "$refused"; fail "a CUDA run was accepted"; }
  grep -q "resources.device is DEVICE_KIND_CUDA but this server has no such device" <<<"$refused" ||
    { echo "$refused"; fail "the CUDA run was refused without naming resources.device"; }
  worker=$($bin/circuitlab-worker --server "127.0.0.1:$port" --device cuda:0 2>&1) && fail "the worker took cuda:0"
  grep -q "device cuda:0 is not available: LibTorch 2.6.0 (CUDA 12.4), 0 CUDA devices" <<<"$worker" ||
    { echo "$worker"; fail "the worker did not say why"; }
  say "server: CUDA build, 0 devices, the demo trained on cpu:0, a CUDA run refused, a cuda:0 worker refused"
  ctest --test-dir /build --output-on-failure --timeout 600 -j "$(nproc)" -L "^e2e$"'
say "checks and e2e passed in $((SECONDS - t2)) s (whole tier $((SECONDS - t0)) s)"
