#!/usr/bin/env python3
"""The server's floors, checked: every #include of our own code must point to
a lower floor (or stay in its own folder), and no two files may include each
other through any path (no loop).

Floors, bottom up. Server modules: common < store, engine < scheduler <
remote, security < telemetry < rpc, http < app < main.cpp. Inside the engine:
the torch helpers < basis/ (the IMIR coordinate system: bases, the tensor
projector) < tasks/ < the torch-free API (spec.*, engine.h) < models/ <
manifold/ (whole-model projection, the invariance checks) < train/ (trainers,
the run loop) < analysis/ < families/ (what differs per model family) < the
facade's implementation (engine.cc). A header and its .cc are one node
of the loop check (but engine.h and engine.cc, two floors apart, are two).

Run from the repository root; prints each violation and exits 1 if any.
`--report` prints the counts only (for issue notes).
"""
import os
import re
import sys
from collections import defaultdict

SERVER_FLOORS = {
    "common": 0, "store": 1, "engine": 1, "scheduler": 2, "remote": 3, "security": 3,
    "telemetry": 4, "rpc": 5, "http": 5, "app": 6, "main.cpp": 7,
}
ENGINE_FLOORS = [  # (path prefix inside server/engine/, floor)
    ("pch.h", 0), ("torch_util.h", 0), ("torch_compat.h", 0), ("basis/", 1),
    ("tasks/", 2), ("spec.", 3), ("engine.h", 3), ("models/", 4), ("manifold/", 5),
    ("train/", 6), ("analysis/", 7), ("families/", 8), ("engine.cc", 9),
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
                    not src_engine and not re.match(r"server/engine/(engine\.h|spec\.h|basis/basis\.h|tasks/catalog\.h)$", inc))
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
    if "--report" in sys.argv:
        print(f"{len(files)} files, {upward} upward/sideways includes, {len(comps)} loops")
        # Where the code tells model families apart outside families/
        # (issue 31 item 2: the goal is none); reported, not yet enforced.
        kind = re.compile(r"ModelSpec::kDecoder|ModelSpec::kImir|LATENT_KIND_REGRESSION|IsLatent\(|NeedsImir\(|"
                          r"has_decoder\(\)|has_imir\(\)")
        where = defaultdict(int)
        for f in files:
            if f.startswith("server/engine/families/"):
                continue
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if kind.search(line) and not line.lstrip().startswith("//"):
                        where[f] += 1
        print(f"{sum(where.values())} model-family checks outside server/engine/families/ in {len(where)} files")
        for f, n in sorted(where.items(), key=lambda x: -x[1]):
            print(f"  {n:3d} {f}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
