#!/usr/bin/env python3
"""Writes the reproduction reports under docs/reproductions/ from finished
reproductions on a server: one page per recipe (`circuitlab reproduce show
ID --markdown`) and index.md, the table of outcomes.

    scripts/reproduction_reports.py --server 127.0.0.1:50051 p1 p6 p7
    scripts/reproduction_reports.py --cli build/client/circuitlab --out docs/reproductions p1

Later ids of the same recipe replace earlier ones. The index keeps the rows
of recipes not named this time (it is rebuilt from every page's header).
With --figures, each page also gets the paper's figures its recipe names
(E.N.png, E.N-2.png, ...; plot_reproduction_figure) and the checks' margins
(E.N-margins.png; plot_reproduction), drawn by the Python package (run the script with a Python that has the
package and matplotlib, e.g. build/python-venv/bin/python after the python
tier).
"""
import argparse
import json
import os
import re
import subprocess
import sys

HEADER = """# Reproductions: the reports

Each page is the report of one recipe (`examples/reproduce/`, see
[reproduce the papers' claims](../howto/reproduce.md)) run by this service at
the scale it names, written by `circuitlab reproduce show ID --markdown`
(`scripts/reproduction_reports.py`). A failed or inconclusive check is
reported as measured: thresholds are SCIENCE.md's and the science tests',
fixed before these runs; [the science implemented](../science.md#reproductions-at-larger-scale)
says what each failure means. Reports run side by side on one machine, so
their wall times overlap, and a reproduction that reuses an earlier one's
runs and stored analyses counts only its own time. Every page shows the paper's figure its recipe
names (E.N.png, and E.N-2.png where it names two) and the checks' margins
per seed (E.N-margins.png).

![E.9 at paper scale in the dashboard](../img/dashboard-reproduction.png)

| claim | title | scale | seeds | passed | failed | inconclusive | reported only | wall time |
|---|---|---|---|---|---|---|---|---|
"""


def cli(args, *argv):
    # `reproduce show` exits 3 when a check failed: the report is still printed.
    p = subprocess.run([args.cli, "--server", args.server, *argv], capture_output=True, text=True)
    if p.returncode not in (0, 3):
        sys.exit(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def figures(args, rid, out, stem):
    """The recipe's own figures (E.N.png, E.N-2.png, ...) and the checks' margins (E.N-margins.png); the
    markdown that shows them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import circuitlab
    c = circuitlab.Client(args.server)
    r = c.get_reproduction(rid)
    md = ["\n## Figures\n"]
    for i, fig in enumerate(r.recipe.scales[r.scale].figures):
        png = stem + (".png" if i == 0 else f"-{i + 1}.png")
        c.plot_reproduction_figure(r, i).savefig(os.path.join(out, png), dpi=110, bbox_inches="tight")
        md.append(f"![{r.recipe_id}: {fig.title}]({png})\n")
        plt.close("all")
    png = stem + "-margins.png"
    c.plot_reproduction(r).figure.savefig(os.path.join(out, png), dpi=110, bbox_inches="tight")
    plt.close("all")
    md.append(f"![{r.recipe_id}: each check's margin per seed]({png})\n")
    return "\n".join(md)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ids", nargs="+", help="finished reproductions, e.g. p1")
    p.add_argument("--server", default=os.environ.get("CIRCUITLAB_TARGET", "127.0.0.1:50051"))
    p.add_argument("--cli", default="build/client/circuitlab")
    p.add_argument("--out", default="docs/reproductions")
    p.add_argument("--figures", action="store_true", help="draw the recipe's figures (E.N.png, ...) and the margins (E.N-margins.png)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for rid in args.ids:
        r = json.loads(cli(args, "--json", "reproduce", "show", rid))
        if r.get("state") != "REPRODUCTION_STATE_DONE":
            sys.exit(f"{rid} is {r.get('state')}, not DONE")
        page = os.path.join(args.out, r["recipe_id"] + ".md")
        with open(page, "w", encoding="utf-8") as f:
            f.write(cli(args, "reproduce", "show", rid, "--markdown"))
        rep = r.get("report", {})
        meta = {"id": r["recipe_id"], "title": r.get("title", ""), "scale": r["scale"], "seeds": r.get("seeds", 1),
                "passed": rep.get("passed", 0), "failed": rep.get("failed", 0),
                "inconclusive": rep.get("inconclusive", 0), "reported": rep.get("reported", 0),
                "wall": rep.get("wall_seconds", 0)}
        if args.figures:
            md = figures(args, rid, args.out, r["recipe_id"])
            with open(page, "a", encoding="utf-8") as f:
                f.write(md)
        with open(page, "a", encoding="utf-8") as f:
            f.write("\n<!-- report: " + json.dumps(meta) + " -->\n")
        print(f"{rid}: wrote {page}")
    rows = []
    for name in os.listdir(args.out):
        if not name.endswith(".md") or name == "index.md":
            continue
        m = re.search(r"<!-- report: (.*) -->", open(os.path.join(args.out, name), encoding="utf-8").read())
        if m:
            rows.append(json.loads(m.group(1)))
    key = lambda m: (m["id"].split(".")[0], int(re.sub(r"\D", "", m["id"].split(".")[-1]) or 0))
    with open(os.path.join(args.out, "index.md"), "w", encoding="utf-8") as f:
        f.write(HEADER)
        for m in sorted(rows, key=key):
            f.write(f"| [{m['id']}]({m['id']}.md) | {m['title']} | `{m['scale']}` | {m['seeds']} | {m['passed']} | "
                    f"{m['failed']} | {m['inconclusive']} | {m.get('reported', 0)} | {m['wall'] / 60:.1f} min |\n")


if __name__ == "__main__":
    main()
