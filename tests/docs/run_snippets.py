#!/usr/bin/env python3
"""Runs the documentation's runnable snippets as a reader would, and compares
their transcripts.

A fenced ```sh or ```python block right after a line `<!-- runnable -->` is
runnable. A fenced block right after `<!-- transcript -->` that follows a
runnable block is what that block prints: the runner compares it with what
the block printed (see match() for the rules). A block after
`<!-- transcript: scripts/demo.sh -->` is what the demo prints (--demo).

The reader's setting, literally: the binaries and the Python package are
installed (`cmake --install BUILD --prefix P`, as scripts/demo.sh does) and
only P/bin and P's Python directory are added to PATH and PYTHONPATH; the
working directory is a copy of a clone (examples/ linked); nothing else is
set. Pages start and stop their own servers on the default ports
(127.0.0.1:50051 and :8080), so the tier holds the ports' lock.

    tests/docs/run_snippets.py --build build --sequence   # every page in the site's order, in ONE bash shell
    tests/docs/run_snippets.py --build build --each       # every page alone, each in a fresh shell and directory
    tests/docs/run_snippets.py --build build docs/tutorials/circuits.md   # one page (alone)
    tests/docs/run_snippets.py --build build --demo       # scripts/demo.sh, against README's and the quick start's transcripts

sh blocks run as they are (the shell has `set -eo pipefail`); python blocks
run as `python3 - <<'EOF'` in the same shell. A block that exits non-zero, or
whose transcript does not match, fails the run, printing the block, its
output and the difference.
"""
import argparse
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNABLE = "<!-- runnable -->"
TRANSCRIPT = re.compile(r"^<!-- transcript(?:: (?P<source>\S+))? -->$")
FENCE = re.compile(r"^```(\w*)\s*$")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d+|\d+)(?:[eE][-+]?\d+)?")
# A number followed by one of these is a duration or a rate: it depends on the machine and its load
# (a loaded CI machine took 7.0 s for a page's 3.0 s), so any number of the same sign matches.
TIME_UNIT = re.compile(r"^\s?(?:s|ms|min|h|it/s|steps/s)\b")


class Block:
    def __init__(self, path, line, lang, code):
        self.path, self.line, self.lang, self.code = path, line, lang, code
        self.transcript = None      # (line, text) of its transcript, if any

    def where(self):
        return f"{os.path.relpath(self.path, ROOT)}:{self.line}"


def _fence(lines, i):
    """(language, body, index after the closing fence) of the fence at lines[i]."""
    m = FENCE.match(lines[i]) if i < len(lines) else None
    if not m:
        return None
    end = i + 1
    while end < len(lines) and not lines[end].startswith("```"):
        end += 1
    return m.group(1), "\n".join(lines[i + 1:end]) + "\n", end + 1


def parse(path):
    """The runnable blocks of a page with their transcripts, and the page's demo transcripts."""
    lines = open(path, encoding="utf-8").read().splitlines()
    blocks, demo = [], []
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        t = TRANSCRIPT.match(s)
        if s == RUNNABLE or t:
            f = _fence(lines, i + 1)
            if not f:
                raise SystemExit(f"{path}:{i + 1}: {s} must be followed by a fenced block")
            lang, body, nxt = f
            if s == RUNNABLE:
                if lang not in ("sh", "python"):
                    raise SystemExit(f"{path}:{i + 1}: {RUNNABLE} must be followed by a ```sh or ```python fence")
                blocks.append(Block(path, i + 3, lang, body))
            elif t.group("source"):
                demo.append((i + 3, t.group("source"), body))
            else:
                if not blocks or blocks[-1].transcript is not None:
                    raise SystemExit(f"{path}:{i + 1}: a transcript must follow a runnable block (one each)")
                blocks[-1].transcript = (i + 3, body)
            i = nxt
            continue
        i += 1
    return blocks, demo


# --- comparing a transcript with what was printed --------------------------------------------------

def _clean(text):
    out = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line)
        line = line.split("\r")[-1]          # a progress bar redrawn in place: what is left on screen
        out.append(re.sub(r"\s+", " ", line).strip())
    while out and not out[-1]:
        out.pop()
    return out


def _decimals(token):
    mantissa = re.split(r"[eE]", token)[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _numbers_agree(want, got, timed):
    w, g = float(want), float(got)
    if timed:   # a time or rate: the machine's, not the result's
        return (w >= 0) == (g >= 0)
    exp = re.split(r"[eE]", want)
    scale = 10.0 ** int(exp[1]) if len(exp) > 1 else 1.0
    return abs(g - w) <= 0.5 * 10.0 ** -_decimals(want) * scale * (1 + 1e-9)


def line_matches(want, got):
    """One transcript line against one printed line: the text equal (runs of spaces as one; `…` matches
    any text; an annotation `<- ...` at the end is the page's, not printed), each number to the
    transcript's printed precision, durations and rates any number of the same sign."""
    want = re.sub(r"\s+<- .*$", "", want)   # a transcript's annotation ("   <- what this says") is not printed
    parts = re.split(r"(…)", want)
    pattern, numbers = "", []
    for part in parts:
        if part == "…":
            pattern += ".*?"
            continue
        pos = 0
        for m in NUMBER.finditer(part):
            pattern += re.escape(part[pos:m.start()]) + "(" + NUMBER.pattern + ")"
            numbers.append((m.group(0), bool(TIME_UNIT.match(part[m.end():]))))
            pos = m.end()
        pattern += re.escape(part[pos:])
    m = re.fullmatch(pattern, got)
    if not m:
        return False
    return all(_numbers_agree(w, m.group(k + 1), timed) for k, (w, timed) in enumerate(numbers))


def match(transcript, output):
    """None when the transcript matches the output, else a message. A line `...` matches any lines
    (none included); every other line must match the next printed line (line_matches)."""
    want, got = _clean(transcript), _clean(output)
    memo = {}

    def go(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(want):
            r = j == len(got)
        elif want[i] == "...":
            r = go(i + 1, j) or (j < len(got) and go(i, j + 1))
        else:
            r = j < len(got) and line_matches(want[i], got[j]) and go(i + 1, j + 1)
        memo[(i, j)] = r
        return r

    sys.setrecursionlimit(max(10000, 4 * (len(want) + 2) * (len(got) + 2)))
    if go(0, 0):
        return None
    # Say where it parts: the longest prefix of the transcript that matches somewhere in order.
    j = 0
    for i, w in enumerate(want):
        if w == "...":
            continue
        k = next((k for k in range(j, len(got)) if line_matches(w, got[k])), None)
        if k is None:
            return f"transcript line {i + 1} matches no printed line (after line {j}):\n  want: {w}"
        j = k + 1
    return "the transcript's lines appear, but with printed lines between them that it does not elide (...)"


# --- running pages -----------------------------------------------------------------------------------

def install(build, prefix):
    """cmake --install, as scripts/demo.sh does; returns (bin dir, python dir)."""
    subprocess.run(["cmake", "--install", build, "--prefix", prefix], check=True, stdout=subprocess.DEVNULL)
    pydirs = glob.glob(os.path.join(prefix, "lib", "python3*", "dist-packages"))
    if not pydirs:
        raise SystemExit(f"cmake --install put no Python package under {prefix}/lib/python3*/dist-packages")
    return os.path.join(prefix, "bin"), pydirs[0]


def reader_env(bindir, pydir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIRCUITLAB_")}
    # Debian's python3 first, as on a fresh Debian machine (a pyenv or venv python3 earlier on the
    # PATH would lack Debian's python3-grpcio).
    env["PATH"] = os.pathsep.join([bindir, "/usr/bin", env.get("PATH", "/bin")])
    env["PYTHONPATH"] = pydir
    env["MPLBACKEND"] = "Agg"
    return env


def ports_free():
    for port in (50051, 8080):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                holder = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
                raise SystemExit(f"127.0.0.1:{port} is taken: the pages start their servers on the default ports; "
                                 f"stop whatever listens there first\n{holder.strip() or '(ss names no holder)'}")


def script(blocks, marks):
    """One bash script running the blocks in order; each block's output goes to marks.K.out, and the
    start and end of each to the marks file. Background jobs (the pages' servers) end with the shell."""
    out = ["set -eo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT", "exec 4>&1 5>&2"]
    for k, b in enumerate(blocks):
        out.append(f"echo 'start {k}' >>{marks}")
        out.append(f"exec >{marks}.{k}.out 2>&1")
        if b.lang == "sh":
            out.append(b.code.rstrip("\n"))
        else:
            out.append("python3 - <<'__CIRCUITLAB_PY__'\n" + b.code.rstrip("\n") + "\n__CIRCUITLAB_PY__")
        out.append("exec >&4 2>&5")
        out.append(f"echo 'end {k}' >>{marks}")
    return "\n".join(out) + "\n"


def run_shell(blocks, env, label):
    """Runs the blocks in one shell; returns the number of failures (0 or 1)."""
    if not blocks:
        return 0
    workdir = tempfile.mkdtemp(prefix="circuitlab-docs-")
    os.symlink(os.path.join(ROOT, "examples"), os.path.join(workdir, "examples"))
    marks = os.path.join(workdir, ".blocks")
    path = os.path.join(workdir, ".reader.sh")
    open(path, "w").write(script(blocks, marks))
    start = time.time()
    proc = subprocess.run(["bash", path], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=3000)
    tail = proc.stdout.decode(errors="replace")
    events = open(marks).read().split("\n") if os.path.exists(marks) else []
    done = {int(e.split()[1]) for e in events if e.startswith("end ")}
    failed = 0
    for k, b in enumerate(blocks):
        out_path = f"{marks}.{k}.out"
        output = open(out_path, errors="replace").read() if os.path.exists(out_path) else ""
        if k not in done:
            print(f"FAIL {b.where()} ({b.lang}, the shell exited {proc.returncode}; {label})\n{b.code}"
                  f"--- output:\n{output}{tail}")
            failed = 1
            break
        if b.transcript:
            problem = match(b.transcript[1], output)
            if problem:
                print(f"FAIL {b.where()} ({b.lang}; {label}): its transcript "
                      f"({os.path.relpath(b.path, ROOT)}:{b.transcript[0]}) does not match: {problem}\n"
                      f"--- the block:\n{b.code}--- printed:\n{output}--- the transcript:\n{b.transcript[1]}")
                failed = 1
                break
            print(f"ok   {b.where()} ({b.lang}, transcript matched)")
        else:
            print(f"ok   {b.where()} ({b.lang})")
    if not failed and proc.returncode != 0:
        print(f"FAIL ({label}): the shell exited {proc.returncode} after its last block:\n{tail}")
        failed = 1
    print(f"---- {label}: {len(blocks)} blocks, {time.time() - start:.1f} s")
    shutil.rmtree(workdir, ignore_errors=True)
    return failed


def site_pages():
    """The pages in the site's order (mkdocs.yml nav), then any page the nav does not list."""
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", open(os.path.join(ROOT, "mkdocs.yml")).read(), re.M)
    pages = [os.path.join(ROOT, "docs", p) for p in nav]
    rest = sorted(set(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)) - set(pages))
    return [p for p in pages + rest if os.path.exists(p)]


def run_demo(build, prefix, env):
    """scripts/demo.sh with its prefix, data and ports of its own; compared with every demo transcript."""
    transcripts = []
    for page in [os.path.join(ROOT, "README.md")] + site_pages():
        for line, source, body in parse(page)[1]:
            if source != "scripts/demo.sh":
                raise SystemExit(f"{page}:{line}: unknown transcript source {source}")
            transcripts.append((page, line, body))
    if not transcripts:
        raise SystemExit("no page has a `transcript: scripts/demo.sh` block")
    workdir = tempfile.mkdtemp(prefix="circuitlab-demo-")
    free = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        free.append(s)
    denv = dict(env, CIRCUITLAB_PREFIX=prefix, CIRCUITLAB_DATA=os.path.join(workdir, "data"),
                CIRCUITLAB_PORT=str(free[0].getsockname()[1]), BUILD_DIR=build,
                CIRCUITLAB_HTTP="127.0.0.1:%d" % free[1].getsockname()[1])
    for s in free:
        s.close()
    start = time.time()
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "demo.sh")], cwd=ROOT, env=denv,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    took = time.time() - start
    output = r.stdout   # standard error merged in order, as a terminal shows it
    shutil.rmtree(workdir, ignore_errors=True)
    if r.returncode != 0:
        print(f"FAIL scripts/demo.sh exited {r.returncode} after {took:.0f} s:\n{output}")
        return 1
    failed = 0
    for page, line, body in transcripts:
        problem = match(body, output)
        where = f"{os.path.relpath(page, ROOT)}:{line}"
        if problem:
            print(f"FAIL {where}: the demo's transcript does not match what scripts/demo.sh printed: {problem}\n"
                  f"--- printed:\n{output}--- the transcript:\n{body}")
            failed += 1
        else:
            print(f"ok   {where} (scripts/demo.sh transcript matched)")
    print(f"---- scripts/demo.sh: {took:.1f} s")
    return failed


def self_test():
    """The comparison rules on cases that must pass and must fail (the tier's own check that a wrong
    transcript is caught). Returns the number of cases that went the wrong way."""
    cases = [  # (transcript, printed, should match)
        ("accuracy 0.961", "accuracy 0.961", True),
        ("accuracy 0.961", "accuracy 0.9612", True),            # to the transcript's printed digits
        ("accuracy 0.961", "accuracy 0.962", False),
        ("rho 9.2e-10", "rho 9.24e-10", True),
        ("rho 9.2e-10", "rho 8.1e-10", False),
        ("5 passed, 0 failed; 3.013 s", "5 passed, 0 failed; 7.039 s", True),   # a duration: any
        ("5 passed, 0 failed; 3.013 s", "4 passed, 1 failed; 3.013 s", False),
        ("120 steps/s", "31 steps/s", True),
        ("took 3 s", "took -3 s", False),
        ("run r1 …  SUCCEEDED", "run r1 (demo) SUCCEEDED", True),
        ("label INDUCTION   <- what it says", "label INDUCTION", True),
        ("label INDUCTION", "label IWL", False),
        ("a\n...\nc", "a\nb\nb\nc", True),
        ("a\nc", "a\nb\nc", False),                          # unelided lines between
        ("a\n...\nd", "a\nb\nc", False),
    ]
    wrong = 0
    for want, got, ok in cases:
        if (match(want, got) is None) != ok:
            wrong += 1
            print(f"FAIL rule case: {want!r} vs printed {got!r} should {'match' if ok else 'not match'}")
    print(f"{len(cases) - wrong} of {len(cases)} comparison rule cases behave")
    return wrong


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--sequence", action="store_true", help="every page in the site's order, in one shell")
    mode.add_argument("--each", action="store_true", help="every page alone (the default with no page named)")
    mode.add_argument("--demo", action="store_true", help="scripts/demo.sh against its transcripts")
    mode.add_argument("--self-test", action="store_true", help="the comparison rules on cases that must pass and fail")
    ap.add_argument("pages", nargs="*")
    args = ap.parse_args()
    if args.self_test:
        return 1 if self_test() else 0
    build = os.path.abspath(args.build)
    prefix = tempfile.mkdtemp(prefix="circuitlab-prefix-")
    try:
        bindir, pydir = install(build, prefix)
        env = reader_env(bindir, pydir)
        if args.demo:
            failed = run_demo(build, prefix, env)
        else:
            ports_free()
            pages = [os.path.abspath(p) for p in args.pages] or site_pages()
            if args.sequence:
                blocks = [b for p in pages for b in parse(p)[0]]
                failed = run_shell(blocks, env, f"{len(pages)} pages in one shell")
            else:
                failed = sum(run_shell(parse(p)[0], env, os.path.relpath(p, ROOT) + " alone") for p in pages)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
    print(f"{failed} failure(s)" if failed else "every runnable snippet and transcript passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
