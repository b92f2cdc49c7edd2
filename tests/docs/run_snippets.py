#!/usr/bin/env python3
"""Runs the documentation's runnable snippets against a real server.

A fenced ```sh or ```python block right after a line `<!-- runnable -->`
is runnable. Each page gets its own fresh server (so its first run is r1,
as the page says) and its own working directory (with `examples/` linked),
and runs its blocks in order: sh blocks with `bash -euo pipefail`, python
blocks with python3 and the client package on PYTHONPATH. A block that
exits non-zero fails the page, printing the block and its output.

    tests/docs/run_snippets.py --build build [docs/tutorials/circuits.md ...]
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = "<!-- runnable -->"


def snippets(path):
    """(line, language, code) of each runnable block of a page."""
    lines = open(path, encoding="utf-8").read().splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == MARK and i + 1 < len(lines):
            m = re.match(r"^```(sh|python)\s*$", lines[i + 1])
            if not m:
                raise SystemExit(f"{path}:{i + 1}: {MARK} must be followed by a ```sh or ```python fence")
            end = i + 2
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            out.append((i + 2, m.group(1), "\n".join(lines[i + 2:end]) + "\n"))
            i = end
        i += 1
    return out


class Server:
    """circuitlab-server on free ports and a fresh data directory."""

    def __init__(self, build, workdir):
        self.log = open(os.path.join(workdir, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [os.path.join(build, "server", "circuitlab-server"), "--data", os.path.join(workdir, "data"),
             "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--cpu-slots", "2"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.port = self.http = None
        deadline = time.time() + 60
        while time.time() < deadline and self.http is None:
            time.sleep(0.1)
            self.log.seek(0)
            text = self.log.read()
            m = re.search(r"listening port=(\d+)", text)
            h = re.search(r"http port=(\d+)", text)
            if m and h:
                self.port, self.http = m.group(1), h.group(1)
            if self.proc.poll() is not None:
                raise SystemExit("the server exited:\n" + text)
        if self.http is None:
            raise SystemExit("the server did not start in 60 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def run_page(path, build):
    blocks = snippets(path)
    if not blocks:
        return 0
    rel = os.path.relpath(path, ROOT)
    workdir = tempfile.mkdtemp(prefix="circuitlab-docs-")
    os.symlink(os.path.join(ROOT, "examples"), os.path.join(workdir, "examples"))
    server = Server(build, workdir)
    env = dict(os.environ)
    env["CIRCUITLAB_TARGET"] = "127.0.0.1:" + server.port
    env["CIRCUITLAB_HTTP"] = "http://127.0.0.1:" + server.http
    env["PATH"] = os.path.join(build, "client") + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.path.join(ROOT, "client", "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["MPLBACKEND"] = "Agg"
    failed = 0
    try:
        for line, lang, code in blocks:
            start = time.time()
            argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
            r = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
            took = time.time() - start
            if r.returncode != 0:
                print(f"FAIL {rel}:{line} ({lang}, exit {r.returncode}, {took:.1f} s)\n{code}--- output:\n"
                      f"{r.stdout}{r.stderr}")
                failed += 1
                break
            print(f"ok   {rel}:{line} ({lang}, {took:.1f} s)")
    finally:
        server.stop()
        if failed:
            server.log.seek(0)
            print("--- server log (tail):\n" + "".join(server.log.readlines()[-20:]))
        shutil.rmtree(workdir, ignore_errors=True)
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("pages", nargs="*")
    args = ap.parse_args()
    pages = args.pages or sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    failed = sum(run_page(os.path.abspath(p), os.path.abspath(args.build)) for p in pages)
    print(f"{failed} page(s) failed" if failed else "every runnable snippet passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
