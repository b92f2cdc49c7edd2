#!/usr/bin/env bash
# The `debian13` tier (issue 35): the checkout built in a Debian 13 root
# (tests/debian13/root.sh cpu: GCC 14, LibTorch 2.6, spdlog 1.15,
# cpp-httplib 0.18) in Release with -Werror, every target, and the unit,
# unit_torch, integration and e2e tiers run there. The build tree and ccache
# stay in the root, so a second run rebuilds only what changed.
#   tests/debian13/debian13_test.sh
# Prints the release's compiler and LibTorch, and the time of each phase.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "debian13_test: $*"; }

t0=$SECONDS
"$here/root.sh" prepare cpu >/dev/null
say "root ready in $((SECONDS - t0)) s"
t1=$SECONDS
"$here/root.sh" run cpu bash -c '
  set -euo pipefail
  echo "debian13_test: $(g++ --version | head -1); LibTorch $(dpkg-query -W -f="\${Version}" libtorch-dev)"
  # The build tree stays in the root between runs; a run from another
  # checkout starts it again (ninja compares times, and another checkout'"'"'s
  # older files would look up to date against this one'"'"'s outputs).
  if [ "$(cat /build/.checkout 2>/dev/null)" != "'"$(cd "$here/../.." && pwd)"'" ]; then rm -rf /build/* /build/.checkout; fi
  mkdir -p /build && echo "'"$(cd "$here/../.." && pwd)"'" >/build/.checkout
  cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release >/tmp/configure.log 2>&1 ||
    { cat /tmp/configure.log; exit 1; }
  cmake --build /build'
say "built in $((SECONDS - t1)) s"
t2=$SECONDS
"$here/root.sh" run cpu ctest --test-dir /build --output-on-failure --timeout 600 -j "$(nproc)" \
  -L '^(unit|unit_torch|integration|e2e)$'
say "tests passed in $((SECONDS - t2)) s (whole tier $((SECONDS - t0)) s)"
