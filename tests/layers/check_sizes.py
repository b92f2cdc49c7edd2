#!/usr/bin/env python3
"""Sizes a maintainer can read (issue 47): no source file over 600 lines in
server/, client/, worker/ or dashboard/ (generated and vendored files aside)
and no C++ function over 100 lines there or in bench/.

A ratchet: files and functions still over their limit would be listed below
with the size they had when the list was written (issue 47 emptied both
lists; keep them empty). The check fails when one not listed goes over, or a
listed one grows; it says so when a listed one has come under its limit, so
that the list only ever shrinks (delete the line). Run from the repository root; `--report` prints the counts only.

A C++ function is a definition whose signature starts at column 0 (over one
or more lines, the last ending with "{") and ends at the next "}" in column
0 (the project's clang-format style); lambdas and functions defined inside a
class body count with their enclosing definition.
"""
import os
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100
FILE_TREES = ("server", "client", "worker", "dashboard")
FUNCTION_TREES = ("server", "client", "worker", "bench")
SOURCE = (".cc", ".h", ".cpp", ".js", ".py")
SKIP_DIRS = {"build", "vendor", "node_modules", "__pycache__"}

# Still over: path -> lines when listed.
FILES_OVER = {}
# Still over: (path, the definition's first line) -> lines when listed.
FUNCTIONS_OVER = {}


def Sources(trees, exts):
    for tree in trees:
        for root, dirs, names in os.walk(tree):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for n in sorted(names):
                if n.endswith(exts) and "_pb2" not in n and ".pb." not in n:
                    yield os.path.join(root, n)


def Functions(path):
    """(first line of the definition, lines) of each C++ definition that starts
    at column 0: a signature (over one or more lines) whose last line ends
    with "{", up to the next "}" in column 0."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    skip = ("namespace", "struct", "class", "enum", "union", "extern", "}", "#", "//", "template", "using",
            "static_assert", "typedef")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or line[0].isspace() or line.startswith(skip) or "(" not in line or \
                "=" in line.split("(")[0] or line.rstrip().endswith(";"):
            i += 1
            continue
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith("{") and not lines[j].rstrip().endswith(";") and \
                j - i < 8:
            j += 1
        if j >= len(lines) or not lines[j].rstrip().endswith("{"):
            i = j + 1
            continue
        k = j if lines[j].rstrip().endswith("}") else j + 1
        while k < len(lines) and not lines[k].startswith("}"):
            k += 1
        yield line.strip(), k - i + 1
        i = k + 1


def main():
    problems, shrunk = [], []
    files_over, functions_over = 0, 0
    seen_files, seen_functions = set(), set()
    for path in Sources(FILE_TREES, SOURCE):
        with open(path, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        listed = FILES_OVER.get(path)
        seen_files.add(path)
        if n > MAX_FILE_LINES:
            files_over += 1
            if listed is None:
                problems.append(f"{path}: {n} lines (at most {MAX_FILE_LINES}: split it by what it serves)")
            elif n > listed:
                problems.append(f"{path}: {n} lines, grew from {listed} (listed as still over {MAX_FILE_LINES})")
        elif listed is not None:
            shrunk.append(f"{path}: {n} lines, under {MAX_FILE_LINES} now: delete its line in FILES_OVER")
    for path in Sources(FUNCTION_TREES, (".cc", ".h", ".cpp")):
        for first, n in Functions(path):
            key = next((k for k in FUNCTIONS_OVER if k[0] == path and first.startswith(k[1])), None)
            seen_functions.add(key)
            if n > MAX_FUNCTION_LINES:
                functions_over += 1
                if key is None:
                    problems.append(f"{path}: {first} is {n} lines (at most {MAX_FUNCTION_LINES})")
                elif n > FUNCTIONS_OVER[key]:
                    problems.append(f"{path}: {first} is {n} lines, grew from {FUNCTIONS_OVER[key]}")
            elif key is not None:
                shrunk.append(f"{path}: {first} is {n} lines now: delete its line in FUNCTIONS_OVER")
    shrunk += [f"{p}: listed in FILES_OVER but gone: delete its line" for p in FILES_OVER if p not in seen_files]
    shrunk += [f"{k[0]}: {k[1]} listed in FUNCTIONS_OVER but gone: delete its line"
               for k in FUNCTIONS_OVER if k not in seen_functions]
    if "--report" in sys.argv:
        print(f"{files_over} files over {MAX_FILE_LINES} lines, {functions_over} functions over "
              f"{MAX_FUNCTION_LINES} lines ({len(problems)} not listed or grown)")
        return 0
    for p in problems + shrunk:
        print(p)
    return 1 if problems or shrunk else 0


if __name__ == "__main__":
    sys.exit(main())
