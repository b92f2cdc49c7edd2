#!/usr/bin/env bash
# Debian 13 (trixie) root file systems beside a Debian 12 machine, for the
# `debian13` and `cuda-build` tiers (issue 35) and for building there by hand:
#
#   tests/debian13/root.sh prepare cpu|cuda    # make or refresh it; prints its path
#   tests/debian13/root.sh run cpu|cuda CMD... # CMD inside it, the checkout read-only at /src
#   tests/debian13/root.sh shell cpu|cuda      # an interactive shell there
#   tests/debian13/root.sh remove cpu|cuda     # delete it (nothing may be mounted in it)
#
#   cpu:  Debian 13's build packages with its CPU LibTorch (libtorch-dev 2.6, GCC 14).
#   cuda: the same with contrib's CUDA LibTorch (libtorch-cuda-dev 2.6) and
#         non-free's nvidia-cuda-toolkit (12.4), its two dependencies that need
#         a GPU host replaced by local stand-ins (deploy/cuda-placeholders.sh).
#
# Chroots, not containers: a root (7 GB with the CUDA toolkit) would otherwise
# be copied into image layers, the chroot keeps its /build and ccache between
# runs (an unchanged tree rebuilds in seconds), needs no engine, and shares
# the machine's loopback, so the e2e tier's servers and clients work as on
# the host. Needs root (chroot, mount) and Debian's mirror.
#
# Each root lives under $CIRCUITLAB_DEPLOY_CACHE (default ~/.cache/circuitlab)
# as roots/trixie-<flavour>, unpacked from deploy/minbase.sh's trixie tarball
# (what deploy/docker-env.sh imports as debian:trixie), with the
# packages of deploy/packages.txt (scripts/packages.sh --release trixie
# --torch <flavour> build runtime check); a change to that list is installed
# at the next prepare. Both roots share one ccache (/ccache), so files that do
# not include LibTorch compile once for both. Inside: /src (the checkout,
# read-only), /build (the build tree), /proc and /dev.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${CIRCUITLAB_DEPLOY_CACHE:-$HOME/.cache/circuitlab}

log() { echo "debian13: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { echo "usage: $0 prepare|run|shell|remove cpu|cuda [CMD...]" >&2; exit 2; }

[ $# -ge 2 ] || usage
verb=$1 flavour=$2
shift 2
case $flavour in cpu | cuda) ;; *) usage ;; esac
root=$cache/roots/trixie-$flavour
[ "$(id -u)" -eq 0 ] || die "needs root (chroot and mount)"

# The machine's Debian mirrors (the main archive, the security archive).
mirror() {
  local m
  m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}
security_mirror() {
  local m
  m=$(awk '/^URIs:/ && /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian-security}"
}

mounted_inside() { findmnt -rn -o TARGET | awk -v r="$root/" 'index($0 "/", r) == 1' | sort -r; }
unmount_all() { mounted_inside | while read -r m; do umount -l "$m" 2>/dev/null || true; done; }

mount_all() {
  mkdir -p "$root/proc" "$root/dev" "$root/src" "$root/ccache" "$cache/roots/ccache"
  mount --bind /proc "$root/proc"
  mount --bind /dev "$root/dev"
  mount --bind "$repo" "$root/src"
  mount -o remount,ro,bind "$root/src"
  mount --bind "$cache/roots/ccache" "$root/ccache"
}

in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 TERM="${TERM:-dumb}" CCACHE_DIR=/ccache DEBIAN_FRONTEND=noninteractive "$@"
}

packages() { "$repo/scripts/packages.sh" --release trixie --torch "$flavour" build runtime check; }

prepare() {
  mkdir -p "$cache/roots"
  unmount_all
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    local tar
    tar=$("$repo/deploy/minbase.sh" trixie)
    [ -z "$(mounted_inside)" ] || die "something is still mounted inside $root"
    rm -rf --one-file-system "$root"
    mkdir -p "$root"
    tar -C "$root" -xf "$tar"
    chmod 755 "$root"
  fi
  local components=main
  [ "$flavour" = cuda ] && components="main contrib non-free non-free-firmware"
  rm -f "$root/etc/apt/sources.list.d/debian.sources"
  printf 'deb %s trixie %s\ndeb %s trixie-updates %s\ndeb %s trixie-security %s\n' \
    "$(mirror)" "$components" "$(mirror)" "$components" "$(security_mirror)" "$components" >"$root/etc/apt/sources.list"
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

  local want stamp
  want=$( (packages; cat "$repo/deploy/cuda-placeholders.sh") | sha256sum | cut -d' ' -f1)
  stamp=$root/.circuitlab-packages
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    trap unmount_all EXIT
    mount_all
    local t0=$SECONDS
    in_root apt-get update -qq >/dev/null
    if [ "$flavour" = cuda ]; then
      cp "$repo/deploy/cuda-placeholders.sh" "$root/tmp/"
      rm -rf "$root/tmp/cuda-debs"
      in_root /tmp/cuda-placeholders.sh control /tmp/cuda-debs >/dev/null
      in_root sh -c 'dpkg -i /tmp/cuda-debs/*.deb' >/dev/null
    fi
    log "installing $(packages | wc -l) packages into $root"
    # shellcheck disable=SC2046
    in_root apt-get install -y -qq --no-install-recommends $(packages) >"$root/tmp/apt.log" 2>&1 ||
      { tail -30 "$root/tmp/apt.log" >&2; die "apt-get install failed in $root"; }
    if [ "$flavour" = cuda ]; then
      in_root /tmp/cuda-placeholders.sh stub /tmp/cuda-debs /usr/lib/x86_64-linux-gnu/libtorch_cuda.so >/dev/null
      in_root sh -c 'dpkg -i /tmp/cuda-debs/nvidia-cudnn_*2_amd64.deb' >/dev/null
      # The stand-ins, for the CUDA image (tests/deploy/cuda_image_test.sh).
      rm -rf "$cache/cuda-debs" && mkdir -p "$cache/cuda-debs" &&
        cp "$root"/tmp/cuda-debs/nvidia-cudnn_*2_amd64.deb "$root"/tmp/cuda-debs/circuitlab-host-libcuda_*.deb \
          "$cache/cuda-debs/"
    fi
    in_root apt-get clean
    log "packages installed in $((SECONDS - t0)) s"
    unmount_all
    trap - EXIT
    echo "$want" >"$stamp"
  fi
  echo "$root"
}

case $verb in
  prepare) prepare ;;
  run | shell)
    [ -x "$root/usr/bin/apt-get" ] || die "no root at $root: run '$0 prepare $flavour' first"
    [ "$verb" = run ] && [ $# -eq 0 ] && usage
    trap unmount_all EXIT
    unmount_all
    mount_all
    if [ "$verb" = shell ]; then in_root bash -l; else in_root "$@"; fi
    ;;
  remove)
    unmount_all
    [ -z "$(mounted_inside)" ] || die "something is still mounted inside $root"
    rm -rf --one-file-system "$root"
    ;;
  *) usage ;;
esac
