#!/usr/bin/env bash
# Installs the Debian packages circuitlab needs (only those missing; list in
# deploy/packages.txt) and builds into build/ with CMake + Ninja.
#   scripts/setup.sh              # everything: packages for building, running, testing, Python and docs; every target
#   scripts/setup.sh --binaries   # build and runtime packages; the server, CLI, worker and the Python package's stubs
#   scripts/setup.sh --python     # the binaries' build and the Python package's Debian packages (grpcio, protobuf, pandas, matplotlib)
#   scripts/setup.sh --docs       # the binaries' build and the documentation site's (mkdocs, mkdocs-material)
#   scripts/setup.sh --install    # the binaries' build, then `cmake --install` into CIRCUITLAB_PREFIX (default /usr/local; sudo if
#                                 # not root): circuitlab, circuitlab-server, circuitlab-worker on PATH, the Python
#                                 # package, examples and docs (docs/howto/install.md)
# The flags combine: scripts/demo.sh runs `--binaries --python --install`.
# Idempotent; re-running only rebuilds what changed. Debian 12 (bookworm) and
# 13 (trixie) alike: the package names come from deploy/packages.txt for this
# machine's release.
# Environment: BUILD_DIR (default build), CMAKE_BUILD_TYPE (default Release: what the image and users build),
# CIRCUITLAB_PREFIX (default /usr/local), CIRCUITLAB_TORCH=cuda (Debian 13 with contrib and non-free enabled:
# Debian's CUDA LibTorch instead of the CPU one; docs/howto/debian-and-gpus.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
stages=(build runtime test python docs)
targets=()
install=0
# Any flag means the binaries' build (--binaries may be left out beside the others).
if [ $# -gt 0 ]; then
  stages=(build runtime)
  targets=(--target circuitlab-server circuitlab circuitlab-worker circuitlab-python)
  for arg in "$@"; do
    case $arg in
      --binaries) ;;
      --python) stages+=(python) ;;
      --docs) stages+=(docs) ;;
      --install) install=1 ;;
      *) sed -n '2,13p' "$0" >&2; exit 2 ;;
    esac
  done
fi

missing=()
while read -r pkg; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < <(scripts/packages.sh --torch "${CIRCUITLAB_TORCH:-cpu}" "${stages[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "==> installing ${#missing[@]} Debian package(s): ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# libopenblas0-pthread registers itself as libblas.so.3 (the reference BLAS is
# ~20x slower for LibTorch's CPU kernels); say which one is active.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
echo "==> BLAS: ${blas:-unknown}"

echo "==> building into ${build_dir}/"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" >/dev/null
cmake --build "$build_dir" "${targets[@]}"

if [ "$install" = 1 ]; then
  prefix="${CIRCUITLAB_PREFIX:-/usr/local}"
  sudo=""
  if [ "$(id -u)" -ne 0 ] && ! { mkdir -p "$prefix" 2>/dev/null && [ -w "$prefix" ]; }; then sudo="sudo"; fi
  echo "==> installing into ${prefix}/ (cmake --install ${build_dir})"
  # Only what the build made: a --binaries build has no test binaries to install anyway.
  $sudo cmake --install "$build_dir" --prefix "$prefix" >/dev/null
fi
