#!/usr/bin/env bash
# The python tier: installs client/python into a fresh venv (Debian's python3,
# --system-site-packages for python3-grpcio/-protobuf/-pandas/-matplotlib,
# pip --no-build-isolation: no PyPI needed) and runs pytest (tests/python)
# against real servers started by its fixtures.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$repo/build}
venv=$build/python-venv
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --no-build-isolation --no-deps "$repo/client/python"
cd "$build"   # not the source tree: the tests must import the installed package
CIRCUITLAB_SERVER_BIN=$build/server/circuitlab-server CIRCUITLAB_CLI_BIN=$build/client/circuitlab exec "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$repo/tests/python" "$repo/tests/python" "$@"
