#!/usr/bin/env python3
"""Citations of the science specification, docs/science/SCIENCE.md.

The code, the command-line output and the documentation cite the spec as
`SCIENCE.md D.1` (or `SCIENCE.md E.6, D.4, G.3`, `SCIENCE.md §E`); the pages
also cite bare D.x and G.x sections ("G.4's gates"). Every numbered section of
the spec has a stable anchor, `<a id="D.1"></a>` on the line above its heading.

    scripts/spec_refs.py check [PATH ...]   # every citation resolves; exit 1 naming each dangling one
    scripts/spec_refs.py anchors            # the spec's anchors, one a line

With no PATH, `check` reads the repository's tracked text files (git ls-files).
The docs site links every citation through the mkdocs hook in
scripts/mkdocs_hooks.py, which uses linkify() below; the docs test tier runs
`check` on the repository and on a fixture that must fail.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "docs", "science", "SCIENCE.md")

SECTION = r"(?:[0A-G](?:\.\d+)+|[A-G](?![\w.]))"
# "SCIENCE.md", an optional "'s", then a list of sections: "E.6, D.4, G.3", "E.3/G.2/G.5", "§E".
CITATION = re.compile(r"SCIENCE\.md(?:'s)?(?P<list>(?:[ ]?§?[ ]?" + SECTION + r")(?:(?:,[ ]?|/|[ ]and[ ])§?" +
                      SECTION + r")*)?")
ONE = re.compile("§?(" + SECTION + ")")
# Bare citations in the pages: D.x and G.x are spec sections only (A-C and E name other things too).
BARE = re.compile(r"(?<![\w.#/§-])([DG](?:\.\d+)+)(?![\w])")
ANCHOR = re.compile(r'^<a id="([^"]+)"></a>\s*$')
NUMBERED = re.compile(r"^(?:#{2,4} ((?:[0A-G])(?:\.\d+)*)\.?\s|\*\*(G\.\d+) )")
FORBIDDEN = "shared/" + "SCIENCE"   # the spec's old home beside a checkout


def anchors(spec=SPEC):
    """The spec's anchors; raises if a numbered section has none."""
    lines = open(spec, encoding="utf-8").read().splitlines()
    ids, previous = set(), None
    for i, line in enumerate(lines):
        m = ANCHOR.match(line)
        if m:
            ids.add(m.group(1))
            previous = m.group(1)
            continue
        n = NUMBERED.match(line)
        if n:
            want = n.group(1) or n.group(2)
            if previous != want:
                raise SystemExit(f"{spec}:{i + 1}: section {want} has no anchor line <a id=\"{want}\"></a> above it")
            previous = None
        elif line.strip():
            previous = None
    return ids


def cited(text):
    """(offset, section) of each section a text cites, with the form it was cited in."""
    out = []
    for m in CITATION.finditer(text):
        if m.group("list"):
            for s in ONE.finditer(m.group("list")):
                out.append((m.start(), s.group(1)))
    return out


def _code_mask(markdown):
    """Spans of fenced blocks, inline code, links' targets and HTML tags, which linkify leaves alone."""
    spans = [m.span() for m in re.finditer(r"^(```|~~~).*?^\1[^\n]*$", markdown, re.S | re.M)]
    spans += [m.span() for m in re.finditer(r"`[^`\n]+`", markdown)]
    for pattern in (r"\]\([^)\s]*\)", r"\[[^\]\n]*\]\(", r"<[^>\n]+>"):   # link targets, link texts, tags
        spans += [m.span() for m in re.finditer(pattern, markdown)]
    spans += [m.span() for m in re.finditer(r"^#{1,6} .*$", markdown, re.M)]
    return sorted(spans)


def _inside(pos, spans):
    return any(a <= pos < b for a, b in spans)


def linkify(markdown, spec_link, ids):
    """Markdown with each citation (outside code, links and headings) a link to the spec's anchor.
    spec_link: the spec's path relative to the page ('' on the spec itself)."""
    spans = _code_mask(markdown)
    edits = []
    for m in CITATION.finditer(markdown):
        if _inside(m.start(), spans):
            continue
        secs = [s.group(1) for s in ONE.finditer(m.group("list") or "")]
        target = secs[0] if secs and secs[0] in ids else None
        edits.append((m.start(), m.end(), f"[{m.group(0)}]({spec_link}" + (f"#{target})" if target else ")")))
    for m in BARE.finditer(markdown):
        if _inside(m.start(), spans) or m.group(1) not in ids:
            continue
        if any(a <= m.start() < b for a, b, _ in edits):
            continue
        edits.append((m.start(), m.end(), f"[{m.group(1)}]({spec_link}#{m.group(1)})"))
    for a, b, new in sorted(edits, reverse=True):
        markdown = markdown[:a] + new + markdown[b:]
    return markdown


def tracked_files():
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True).stdout
    return [os.path.join(ROOT, p) for p in out.decode().split("\0") if p]


def check(paths):
    ids = anchors()
    problems = []
    for path in paths:
        if os.path.abspath(path) in (SPEC, os.path.abspath(__file__), os.path.join(ROOT, "tests/docs/spec_refs_test.sh")):
            continue   # the spec's anchors are checked by anchors(); these files name the forms
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        rel = os.path.relpath(path, ROOT)
        for offset, section in cited(text):
            if section not in ids:
                line = text.count("\n", 0, offset) + 1
                problems.append(f"{rel}:{line}: cites SCIENCE.md {section}, which has no section (anchor) of that number")
        if path.endswith(".md"):
            masked = _code_mask(text)
            for m in BARE.finditer(text):
                if m.group(1) not in ids and not _inside(m.start(), masked):
                    line = text.count("\n", 0, m.start()) + 1
                    problems.append(f"{rel}:{line}: cites {m.group(1)}, which is no section of SCIENCE.md")
        for m in re.finditer(r"SCIENCE\.md#([\w.]*\w)", text):
            if m.group(1) not in ids:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{rel}:{line}: links SCIENCE.md#{m.group(1)}, an anchor the spec does not have")
        if FORBIDDEN in text:
            line = text.count("\n", 0, text.index(FORBIDDEN)) + 1
            problems.append(f"{rel}:{line}: points at the spec's old home outside the repository; "
                            "it is docs/science/SCIENCE.md")
    return problems


def main(argv):
    if argv[:1] == ["anchors"]:
        print("\n".join(sorted(anchors())))
        return 0
    if argv[:1] != ["check"]:
        print(__doc__, file=sys.stderr)
        return 2
    paths = argv[1:] or [p for p in tracked_files() if "/tests/docs/fixtures/" not in p]
    problems = check(paths)
    for p in problems:
        print(p)
    print(f"{len(problems)} dangling citation(s) of SCIENCE.md" if problems else
          f"every citation of SCIENCE.md resolves ({len(paths)} files read)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
