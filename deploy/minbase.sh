#!/usr/bin/env bash
# A Debian root file system (debootstrap --variant=minbase) as a tarball,
# made once and cached: what deploy/docker-env.sh imports as the base images
# debian:bookworm and debian:trixie (no registry is reachable here), and what
# tests/debian13/root.sh unpacks for the Debian 13 tiers.
#
#   deploy/minbase.sh bookworm|trixie    # prints the tarball's path
#
# The root's apt reaches this machine's mirrors (main only; the CUDA image
# adds contrib and non-free itself). Cached under $CIRCUITLAB_DEPLOY_CACHE
# (default ~/.cache/circuitlab) as SUITE-minbase.tar; about a minute and
# 210 MB each. Needs root and Debian's mirror.
set -euo pipefail
suite=${1:-}
case $suite in bookworm | trixie) ;; *) echo "usage: $0 bookworm|trixie" >&2; exit 2 ;; esac
cache=${CIRCUITLAB_DEPLOY_CACHE:-$HOME/.cache/circuitlab}
tar=$cache/$suite-minbase.tar
log() { echo "minbase: $*" >&2; }

mkdir -p "$cache"
# Tiers that start together (debian13, cuda-build) make it once.
exec 9>"$tar.lock"
flock 9
if [ ! -s "$tar" ]; then
  command -v debootstrap >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  sources=/etc/apt/sources.list.d/debian.sources
  mirror=$(awk '/^URIs:/{print $2; exit}' "$sources" 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  security=$(awk '/^URIs:/ && /security/ {print $2; exit}' "$sources" 2>/dev/null || true)
  security=${security:-http://deb.debian.org/debian-security}
  root=$(mktemp -d "$cache/$suite-root.XXXXXX")
  chmod 755 "$root"  # the image's / (mktemp made it 0700: no other user could enter it)
  trap 'rm -rf --one-file-system "$root" "$root.log"' EXIT
  log "debootstrap $suite from $mirror (about a minute, cached in $tar)"
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 ||
    { tail -20 "$root.log" >&2; log "debootstrap failed"; exit 1; }
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  tar -C "$root" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
fi
echo "$tar"
