#!/usr/bin/env bash
# Installs the Debian packages circuitlab needs (only those missing; list in
# deploy/packages.txt) and builds into build/ with CMake + Ninja.
#   scripts/setup.sh              # everything: packages for building, running and testing; every target
#   scripts/setup.sh --binaries   # what the demo needs: build and runtime packages; the server, CLI and worker
# Idempotent; re-running only rebuilds what changed. Debian 12 (bookworm) and
# 13 (trixie) alike: the package names come from deploy/packages.txt for this
# machine's release.
# Environment: BUILD_DIR (default build), CMAKE_BUILD_TYPE (default Release: what the image and users build),
# CIRCUITLAB_TORCH=cuda (Debian 13 with contrib and non-free enabled: Debian's CUDA LibTorch instead of the
# CPU one; docs/howto/debian-and-gpus.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
stages=(build runtime test)
targets=()
if [ "${1:-}" = "--binaries" ]; then
  stages=(build runtime)
  targets=(--target circuitlab-server circuitlab circuitlab-worker)
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
