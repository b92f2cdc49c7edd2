#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite with CTest.
#   scripts/test.sh                 # every tier but long: unit, unit_torch, integration, e2e, fuzz, science, deploy (Docker)
#   scripts/test.sh -L long         # the long science checks (E.5), minutes each
#   scripts/test.sh -L unit         # extra arguments go to ctest (e.g. one label)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir="${BUILD_DIR:-build}"
start=$(date +%s)
# Without arguments every tier but "long" (claims beyond CI's budget) runs.
if [[ $# -eq 0 ]]; then set -- -LE '^long$'; fi
ctest --test-dir "$build_dir" --output-on-failure --timeout 3600 -j "$(nproc)" "$@"
echo "==> tests passed in $(( $(date +%s) - start )) s"
