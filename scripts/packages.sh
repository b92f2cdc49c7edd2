#!/usr/bin/env bash
# Prints the Debian packages of deploy/packages.txt needed by the given stages.
#   scripts/packages.sh build test      -> one package name per line
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
list="${PACKAGES_FILE:-$here/deploy/packages.txt}"
[ $# -gt 0 ] || { echo "usage: $0 STAGE [STAGE...]  (stages: build runtime test bench)" >&2; exit 2; }
awk -v want="$*" '
  BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) need[w[i]] = 1 }
  /^[[:space:]]*(#|$)/ { next }
  { for (i = 2; i <= NF; i++) if ($i in need) { print $1; break } }
' "$list"
