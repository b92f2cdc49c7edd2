#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/), with Debian's mkdocs and
# mkdocs-material; nothing is fetched.
#   scripts/docs.sh build      # generate the reference (protos, --help), then mkdocs build --strict into build/site/
#   scripts/docs.sh serve      # the same, then a live preview on http://127.0.0.1:8000/ (ADDR=host:port to change)
#   scripts/docs.sh check      # the hand-written reference is complete: server flags, CLI verbs, RPCs
#   scripts/docs.sh snippets   # run every runnable snippet of docs/ against fresh servers
# Needs the server and the CLI built (scripts/setup.sh --binaries); BUILD_DIR
# (default build) says where.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
# Debian's python3 has python3-protobuf; a pyenv or venv python may not.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
generate() { "$py" scripts/docs_reference.py generate --build "$build"; }
case "${1:-}" in
  build) generate && mkdocs build --strict --site-dir "$build/site" ;;
  serve) generate && mkdocs serve --dev-addr "${ADDR:-127.0.0.1:8000}" ;;
  check) "$py" scripts/docs_reference.py check --build "$build" ;;
  snippets) shift; "$py" tests/docs/run_snippets.py --build "$build" "$@" ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
