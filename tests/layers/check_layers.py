#!/usr/bin/env python3
"""The server's floors, checked: every #include of our own code must point to
a lower floor (or stay in its own folder), and no two files may include each
other through any path (no loop).

Floors, bottom up. Server modules: common < store, engine, security (it
knows principals and roles; who owns what comes through its Directory) <
scheduler < remote, reproduce < telemetry < rpc, http < app < main.cpp. Inside the engine:
the torch helpers < basis/ (the IMIR coordinate system: bases, the tensor
projector) < tasks/ < families/spec/ (the model families' torch-free half)
< the torch-free API (spec.*, api.h) < models/ <
manifold/ (whole-model projection, the invariance checks) < setup/ (a run's
model, seeds, evaluation sets and checkpoints as training and analysis both
read them) < train/ (trainers, the run loop) < analysis/ < families/ (what differs per model family) < the
facade's implementation (engine.cc). A header and its .cc are one node
of the loop check (the API, api.h, and the facade that implements it,
engine.cc, are two nodes seven floors apart: issue 47 named them apart).

Model families are told apart in server/engine/families/ only (issue 31):
a model-kind check anywhere else (ModelSpec::kDecoder, has_imir(), a
LATENT_KIND_REGRESSION branch outside the task catalogue and generators,
...) is a violation; everything else asks the family (SpecFamilyOf, FamilyOf).

Beside the server, the programs built on it (issue 47): client/lib < client/cli;
worker/ (a process that runs the engine and calls home as a client); bench/
on top. Outside server/ a file may include server/common/ (the torch-free,
gRPC-free helpers every program shares); the clients also the proto-only
report renderer (server/reproduce/render.h, which the server's HTTP report
uses too); the worker the engine's torch-free API and client/lib (its
channel home); bench/ anything below it (it measures every layer). Nothing
under server/ includes client/, worker/ or bench/.

Run from the repository root; prints each violation and exits 1 if any.
`--report` prints the counts only (for issue notes).
"""
import os
import re
import sys
from collections import defaultdict

SERVER_FLOORS = {
    "common": 0, "store": 1, "engine": 1, "security": 1, "slurm": 1, "scheduler": 2, "remote": 3, "reproduce": 3,
    "telemetry": 4, "rpc": 5, "http": 5, "app": 6, "main.cpp": 7,
}
ENGINE_FLOORS = [  # (path prefix inside server/engine/, floor); first match wins
    ("pch.h", 0), ("torch_util.h", 0), ("torch_compat.h", 0), ("basis/", 1),
    ("tasks/", 2), ("families/spec/", 3), ("spec.", 4), ("api.h", 4), ("models/", 5),
    ("manifold/", 6), ("setup/", 7), ("train/", 8), ("analysis/", 9), ("families/", 10), ("engine.cc", 11),
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:server|client|worker|bench)/[^"]+)"', re.M)
OUTER_TREES = ("client", "worker", "bench")
ENGINE_API = r"server/engine/(api\.h|spec\.h|basis/basis\.h|tasks/catalog\.h|families/spec/spec_family\.h)$"
# (tree prefix, floor, what else it may include outside its own tree).
OUTER_FLOORS = [
    ("client/lib/", 10, [r"server/common/", r"server/reproduce/render\.h$"]),
    ("client/cli/", 11, [r"client/lib/", r"server/common/", r"server/reproduce/render\.h$"]),
    ("worker/", 12, [r"client/lib/", r"server/common/", ENGINE_API]),
    ("bench/", 13, [r"server/", r"client/lib/"]),
]


def outer_room(path):
    for prefix, floor, allowed in OUTER_FLOORS:
        if path.startswith(prefix):
            return prefix, floor, allowed
    return None, None, None


def OuterProblems(files, edges):
    """Upward or sideways includes of the programs beside the server, and of
    the server into them; fills `edges` for the loop check."""
    problems = []
    for f in sorted(files):
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        src, _, allowed = outer_room(f)
        for inc in INCLUDE.findall(text):
            if not os.path.exists(inc):
                continue
            if f.startswith("server/"):
                if inc.startswith(tuple(t + "/" for t in OUTER_TREES)):
                    problems.append(f"{f} -> {inc}: the server includes a program built on it")
                continue
            edges[node(f)].add(node(inc))
            if src is None:
                problems.append(f"{f}: in no floor (add its folder to OUTER_FLOORS in tests/layers/check_layers.py)")
                break
            if inc.startswith(src) or any(re.match(a, inc) for a in allowed):
                continue
            problems.append(f"{f} -> {inc}: includes upward or sideways ({src} may include its own folder and "
                            f"{', '.join(allowed)})")
    return problems


def engine_room(rel):
    for prefix, floor in ENGINE_FLOORS:
        if rel.startswith(prefix):
            return prefix.rstrip("/"), floor
    return None, None


def room(path):
    """(room name, floor, is_engine) of a path under server/."""
    rel = path[len("server/"):]
    top = rel.split("/")[0]
    if top == "engine":
        name, floor = engine_room(rel[len("engine/"):])
        return ("engine/" + name if name else None), floor, True
    return top, SERVER_FLOORS.get(top), False


def node(path):
    """A header and its source are one node."""
    return os.path.splitext(path)[0]


MODEL_KIND = re.compile(r"ModelSpec::kDecoder|ModelSpec::kImir|IsLatent\(|NeedsImir\(|has_decoder\(\)|has_imir\(\)")
# A latent task's kind: the task catalogue and generators describe each
# kind (their job); a branch on REGRESSION anywhere else picks a family.
TASK_KIND = re.compile(r"LATENT_KIND_REGRESSION")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def FamilyChecks(files):
    """(file, line, text) of each model-family check outside families/:
    code only (comments and string literals do not count)."""
    found = []
    for f in sorted(files):
        if f.startswith("server/engine/families/"):
            continue
        task_room = f.startswith("server/engine/tasks/")
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                code = STRING.sub('""', line.split("//")[0])
                if MODEL_KIND.search(code) or (not task_room and TASK_KIND.search(code)):
                    found.append((f, n, line.strip()))
    return found


def main():
    files, outer = [], []
    for tree in ("server",) + OUTER_TREES:
        for root, dirs, names in os.walk(tree):
            dirs[:] = [d for d in dirs if d not in ("build", "python", "node_modules")]
            found = [os.path.join(root, n) for n in names if n.endswith((".h", ".cc", ".cpp"))]
            (files if tree == "server" else outer).extend(found)
    problems = []
    edges = defaultdict(set)
    outer_problems = OuterProblems(files + outer, edges)
    problems += outer_problems
    upward = len(outer_problems)
    for f in sorted(files):
        src_room, src_floor, src_engine = room(f)
        if src_floor is None:
            problems.append(f"{f}: in no floor (add its folder to tests/layers/check_layers.py)")
            continue
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            if not os.path.exists(inc) or not inc.startswith("server/"):
                continue  # generated (dashboard_assets), not ours, or OuterProblems' concern
            dst_room, dst_floor, dst_engine = room(inc)
            edges[node(f)].add(node(inc))
            if dst_room == src_room or dst_floor is None:
                continue
            if src_engine and dst_engine:
                bad = dst_floor > src_floor or (dst_floor == src_floor and dst_room != src_room and
                                                {src_room, dst_room} != {"engine/spec.", "engine/api.h"})
            elif src_engine != dst_engine:
                # Engine files see only common/ outside the engine; others see
                # the engine through its torch-free API only.
                bad = (src_engine and dst_room != "common") or (
                    not src_engine and not re.match(ENGINE_API, inc))
            else:
                bad = dst_floor >= src_floor
            if bad:
                upward += 1
                problems.append(f"{f} -> {inc}: includes upward or sideways ({src_room} floor {src_floor}, "
                                f"{dst_room} floor {dst_floor})")
    # Loops: Tarjan's strongly connected components over header+source nodes.
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    for comp in comps:
        problems.append("include loop: " + " <-> ".join(comp))
    family_checks = FamilyChecks(files)
    for f, line, text in family_checks:
        problems.append(f"{f}:{line}: tells model families apart outside server/engine/families/ "
                        f"(ask the family: SpecFamilyOf/FamilyOf): {text}")
    if "--report" in sys.argv:
        print(f"{len(files) + len(outer)} files (server/, client/, worker/, bench/), {upward} upward/sideways includes, {len(comps)} loops, "
              f"{len(family_checks)} model-family checks outside server/engine/families/")
        return 0
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
