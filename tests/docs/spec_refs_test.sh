#!/usr/bin/env bash
# The science spec's citations: every one in the repository resolves to a
# section of docs/science/SCIENCE.md, and the check fails, naming each, on a
# fixture of dangling ones (so a passing check is not a check that cannot fail).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python3 "$repo/scripts/spec_refs.py" check
fixture="$repo/tests/docs/fixtures/dangling_citation.md"
if out=$(python3 "$repo/scripts/spec_refs.py" check "$fixture"); then
  echo "FAIL: the check passed on $fixture:"; echo "$out"; exit 1
fi
expected='tests/docs/fixtures/dangling_citation.md:3: cites SCIENCE.md E.99, which has no section (anchor) of that number
tests/docs/fixtures/dangling_citation.md:6: cites SCIENCE.md E.77, which has no section (anchor) of that number
tests/docs/fixtures/dangling_citation.md:4: cites G.42, which is no section of SCIENCE.md
tests/docs/fixtures/dangling_citation.md:6: links SCIENCE.md#F.9, an anchor the spec does not have
4 dangling citation(s) of SCIENCE.md'
if [ "$out" != "$expected" ]; then
  echo "FAIL: the check on $fixture said:"; echo "$out"; echo "--- expected:"; echo "$expected"; exit 1
fi
echo "the dangling fixture fails as expected (4 citations named)"
