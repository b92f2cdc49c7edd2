#!/usr/bin/env python3
"""The server's floors, checked: every #include of our own code must point to
a lower floor (or stay in its own folder), and no two files may include each
other through any path (no loop).

Floors, bottom up. Server modules: common < store, engine < scheduler <
remote, security < telemetry < rpc, http < app < main.cpp. Inside the engine:
the torch helpers < basis/ (the IMIR coordinate system: bases, the tensor
projector) < tasks/ < families/spec/ (the model families' torch-free half)
< the torch-free API (spec.*, engine.h) < models/ <
manifold/ (whole-model projection, the invariance checks) < train/ (trainers,
the run loop) < analysis/ < families/ (what differs per model family) < the
facade's implementation (engine.cc). A header and its .cc are one node
of the loop check (but engine.h and engine.cc, two floors apart, are two).

Model families are told apart in server/engine/families/ only (issue 31):
a model-kind check anywhere else (ModelSpec::kDecoder, has_imir(), a
LATENT_KIND_REGRESSION branch outside the task catalogue and generators,
...) is a violation; everything else asks the family (SpecFamilyOf, FamilyOf).

Run from the repository root; prints each violation and exits 1 if any.
`--report` prints the counts only (for issue notes).
"""
import os
import re
import sys
from collections import defaultdict

SERVER_FLOORS = {
    "common": 0, "store": 1, "engine": 1, "scheduler": 2, "remote": 3, "reproduce": 3, "security": 3,
    "telemetry": 4, "rpc": 5, "http": 5, "app": 6, "main.cpp": 7,
}
ENGINE_FLOORS = [  # (path prefix inside server/engine/, floor); first match wins
    ("pch.h", 0), ("torch_util.h", 0), ("torch_compat.h", 0), ("basis/", 1),
    ("tasks/", 2), ("families/spec/", 3), ("spec.", 4), ("engine.h", 4), ("models/", 5),
    ("manifold/", 6), ("train/", 7), ("analysis/", 8), ("families/", 9), ("engine.cc", 10),
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"(server/[^"]+)"', re.M)


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
    """A header and its source are one node, except the engine's facade:
    engine.h is the torch-free API (floor 3), engine.cc its implementation
    at the top."""
    return path if path.startswith("server/engine/engine.") else os.path.splitext(path)[0]


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
    files = []
    for root, _, names in os.walk("server"):
        files += [os.path.join(root, n) for n in names if n.endswith((".h", ".cc", ".cpp"))]
    problems = []
    edges = defaultdict(set)
    upward = 0
    for f in sorted(files):
        src_room, src_floor, src_engine = room(f)
        if src_floor is None:
            problems.append(f"{f}: in no floor (add its folder to tests/layers/check_layers.py)")
            continue
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            if not os.path.exists(inc):
                continue  # generated (dashboard_assets) or not ours
            dst_room, dst_floor, dst_engine = room(inc)
            edges[node(f)].add(node(inc))
            if dst_room == src_room or dst_floor is None:
                continue
            if src_engine and dst_engine:
                bad = dst_floor > src_floor or (dst_floor == src_floor and dst_room != src_room and
                                                {src_room, dst_room} != {"engine/spec.", "engine/engine.h"})
            elif src_engine != dst_engine:
                # Engine files see only common/ outside the engine; others see
                # the engine through its torch-free API only.
                bad = (src_engine and dst_room != "common") or (
                    not src_engine and not re.match(r"server/engine/(engine\.h|spec\.h|basis/basis\.h|tasks/catalog\.h|families/spec/spec_family\.h)$", inc))
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
        print(f"{len(files)} files, {upward} upward/sideways includes, {len(comps)} loops, "
              f"{len(family_checks)} model-family checks outside server/engine/families/")
        return 0
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
