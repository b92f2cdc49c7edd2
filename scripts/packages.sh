#!/usr/bin/env bash
# Prints the Debian packages of deploy/packages.txt needed by the given stages
# on one Debian release with one LibTorch.
#   scripts/packages.sh build test                      -> one package name per line
#   scripts/packages.sh --release trixie --torch cuda build runtime
# --release: bookworm or trixie (default: this machine's, from /etc/os-release);
# --torch: cpu or cuda (default cpu). Environment: PACKAGES_FILE (the list).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
list="${PACKAGES_FILE:-$here/deploy/packages.txt}"
release=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
torch=cpu
usage() { echo "usage: $0 [--release bookworm|trixie] [--torch cpu|cuda] STAGE [STAGE...]  (stages: build runtime check test python docs bench)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --release) release=${2:-}; shift 2 ;;
    --torch) torch=${2:-}; shift 2 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || usage
case $release in bookworm | trixie) ;; *) echo "$0: Debian release '$release' is not bookworm or trixie (use --release)" >&2; exit 2 ;; esac
case $torch in cpu) ;; cuda) [ "$release" = trixie ] || { echo "$0: --torch cuda needs trixie (Debian 13)" >&2; exit 2; } ;; *) usage ;; esac
awk -v want="$*" -v release="$release" -v torch="$torch" '
  BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) need[w[i]] = 1
          where["bookworm"] = where["trixie"] = where["cpu"] = where["cuda"] = 1 }
  /^[[:space:]]*(#|$)/ { next }
  {
    stage = 0; rel = ""; tor = ""
    for (i = 2; i <= NF; i++) {
      if ($i == "bookworm" || $i == "trixie") rel = $i
      else if ($i == "cpu" || $i == "cuda") tor = $i
      else if ($i in need) stage = 1
    }
    if (stage && (rel == "" || rel == release) && (tor == "" || tor == torch)) print $1
  }
' "$list"
