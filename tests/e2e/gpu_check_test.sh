#!/usr/bin/env bash
# scripts/gpu-check.sh's CPU-side parts (issue 35; label e2e): the whole
# sequence on CPU slots passes all seven checks, and the GPU mode on a machine
# (or build) without CUDA devices fails at its first check, saying why.
#   BUILD_DIR=build tests/e2e/gpu_check_test.sh
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
export BUILD_DIR=${BUILD_DIR:-$repo/build}
out=$("$repo/scripts/gpu-check.sh" --cpu 2>&1)
rc=$?
echo "$out" | grep -E '^(PASS|FAIL)'
[ $rc = 0 ] || { echo "$out"; echo "gpu_check_test: --cpu exited $rc"; exit 1; }
[ "$(grep -c '^PASS ' <<<"$out")" = 7 ] || { echo "gpu_check_test: want 7 PASS lines"; exit 1; }
out=$("$repo/scripts/gpu-check.sh" 2>&1)
rc=$?
if [ $rc = 1 ] && grep -q '^FAIL devices    no CUDA device' <<<"$out"; then
  echo "gpu_check_test: without a GPU the CUDA mode fails at 'devices', as it should"
else
  echo "$out"
  # A machine with a GPU and a CUDA build passes instead.
  grep -q '^PASS devices .*CUDA ([0-9.]*), [1-9]' <<<"$out" && [ $rc = 0 ] || exit 1
fi
echo "gpu_check_test: PASS"
