#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/), with Debian's mkdocs and
# mkdocs-material; nothing is fetched.
#   scripts/docs.sh build      # generate the reference (protos, --help), then mkdocs build --strict into build/site/
#   scripts/docs.sh serve      # on a fresh machine too: installs mkdocs and builds the binaries (scripts/setup.sh
#                              # --docs), then a live preview on http://127.0.0.1:8000/ (ADDR=host:port to change)
#   scripts/docs.sh check      # the hand-written reference is complete: server flags, CLI verbs, RPCs; every
#                              # SCIENCE.md citation resolves (scripts/spec_refs.py)
#   scripts/docs.sh snippets [--sequence|--each|--demo] [PAGE...]
#                              # run the pages' runnable snippets as a reader would and compare their
#                              # transcripts (tests/docs/run_snippets.py)
# build, check and snippets need the server and the CLI built (scripts/setup.sh
# --docs); BUILD_DIR (default build) says where.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
# Debian's python3 has python3-protobuf; a pyenv or venv python may not.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
generate() { "$py" scripts/docs_reference.py generate --build "$build"; }
case "${1:-}" in
  build) generate && mkdocs build --strict --site-dir "$build/site" ;;
  serve) scripts/setup.sh --docs && generate && mkdocs serve --dev-addr "${ADDR:-127.0.0.1:8000}" ;;
  check) "$py" scripts/docs_reference.py check --build "$build" && "$py" scripts/spec_refs.py check ;;
  snippets) shift; "$py" tests/docs/run_snippets.py --build "$build" "$@" ;;
  *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
