"""Plots over the client's DataFrames (matplotlib, imported when first used). Each returns its Axes."""
import math


def _plt():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib (Debian: apt-get install python3-matplotlib)") from None
    return plt


def _axes(ax):
    if ax is not None:
        return ax
    _, ax = _plt().subplots(figsize=(7, 4))
    return ax


def _smooth(values, weight):
    """Exponential moving average, debiased at the start."""
    if not weight:
        return list(values)
    out, s = [], 0.0
    for n, y in enumerate(values, 1):
        s = weight * s + (1 - weight) * y
        out.append(s / (1 - weight ** n))
    return out


def plot_metrics(client, runs, names, ax=None, logy=False, smooth=0.0):
    """Metric curves (one line per run and name) against the step."""
    ax = _axes(ax)
    df = client.metrics_df(runs, [names] if isinstance(names, str) else names)
    for (run_id, name), g in df.groupby(["run_id", "name"], sort=True):
        ax.plot(g["step"], _smooth(g["value"], smooth), label=f"{run_id} {name}")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.legend(fontsize="small")
    return ax


_STYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]


def plot_coordinates(client, runs, names=("alpha", "beta", "gamma", "delta"), rho=True, ax=None):
    """The IMIR coordinates over training, and rho (the off-manifold residual, in [0, 1]) on its own
    right-hand axis. One run: a colour per coordinate, rho dashed grey. Several runs: a colour per run,
    a line style per coordinate, each run's rho a thick dotted line in its colour. One legend (both
    axes) inside the plot."""
    plt = _plt()
    ax = _axes(ax)
    runs = [runs] if isinstance(runs, str) else list(runs)
    df = client.coordinates_df(runs, names)
    order = [n for n in names if n in set(df["name"])] + sorted(set(df["name"]) - set(names)) if len(df) else []
    colours = plt.get_cmap("tab10")
    several = len(runs) > 1
    groups = dict(iter(df.groupby(["run_id", "name"], sort=False))) if len(df) else {}
    for (run_id, name), g in sorted(groups.items(), key=lambda kv: (runs.index(kv[0][0]) if kv[0][0] in runs else 0,
                                                                     order.index(kv[0][1]))):
        r, k = runs.index(run_id) if run_id in runs else 0, order.index(name)
        if several:
            ax.plot(g["step"], g["value"], color=colours(r % 10), linestyle=_STYLES[k % len(_STYLES)],
                    label=f"{run_id} {name}")
        else:
            ax.plot(g["step"], g["value"], color=colours(k % 10), label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("coordinate")
    handles, labels = ax.get_legend_handles_labels()
    if rho:
        m = client.metrics_df(runs, ["manifold/rho"])
        if len(m):
            ax2 = ax.twinx()
            for run_id, g in m.groupby("run_id", sort=False):
                r = runs.index(run_id) if run_id in runs else 0
                ax2.plot(g["step"], g["value"], linestyle=":" if several else "--", linewidth=2.2 if several else 1.5,
                         color=colours(r % 10) if several else "grey", label=f"{run_id} ρ" if several else "ρ")
            ax2.set_ylabel("ρ (off-manifold residual)")
            ax2.set_ylim(0, max(1.0, float(m["value"].max()) * 1.05))
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, fontsize="small", loc="best", ncol=2 if len(handles) > 6 else 1)
    return ax


def plot_phase_diagram(client, sweep_id, x, y, value, aggregate=None, ax=None):
    """A sweep's pivot as a map: text values (circuit labels) as colours with a legend, numbers as a
    heatmap with a colour bar. The figure is laid out so that the legend and colour bar stay inside it
    when saved (`ax.figure.savefig(...)`)."""
    plt = _plt()
    ax = _axes(ax)
    _fit(ax.figure)  # before the colour bar takes its space
    pivot = (x, y, value) + ((aggregate,) if aggregate else ())
    df = client.sweep_summary_df(sweep_id, pivot=pivot)
    cells = df.values.tolist()
    flat = [v for row in cells for v in row if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if flat and all(isinstance(v, str) for v in flat):
        labels = sorted(set(flat))
        codes = [[labels.index(v) if isinstance(v, str) else math.nan for v in row] for row in cells]
        cmap = plt.get_cmap("tab10", len(labels))
        ax.imshow(codes, origin="lower", cmap=cmap, vmin=-0.5, vmax=len(labels) - 0.5, aspect="auto")
        from matplotlib.patches import Patch
        ax.legend(handles=[Patch(color=cmap(i), label=l) for i, l in enumerate(labels)], fontsize="small",
                  bbox_to_anchor=(1.02, 1), loc="upper left", borderaxespad=0)
    else:
        numbers = [[v if isinstance(v, (int, float)) else math.nan for v in row] for row in cells]
        im = ax.imshow(numbers, origin="lower", aspect="auto")
        plt.colorbar(im, ax=ax, label=value)
    ax.set_xticks(range(len(df.columns)), [str(c) for c in df.columns])
    ax.set_yticks(range(len(df.index)), [str(i) for i in df.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(f"{value} ({sweep_id})")
    return ax


def _fit(fig):
    """Lays the figure out (constrained layout) so that every artist, a legend outside the axes
    included, is inside it when saved."""
    try:
        fig.set_layout_engine("constrained")
    except AttributeError:  # matplotlib < 3.6
        fig.set_constrained_layout(True)


_DIRECTION = {"COMPARISON_GE": 1, "COMPARISON_GT": 1, "COMPARISON_LE": -1, "COMPARISON_LT": -1}


def _margin(value, against, sign):
    """How far a value is from its threshold in the claim's direction, in [-1, 1] (> 0: on the passing side)."""
    scale = max(abs(value), abs(against), 1e-12)
    return max(-1.0, min(1.0, sign * (value - against) / scale))


def plot_reproduction(client, reproduction, ax=None):
    """A reproduction's report as a figure: one row per check, one dot per seed at its margin, (value - threshold)
    / max(|value|, |threshold|) turned so that the passing side is to the right (equality and "contains" checks sit
    at +1 when they hold, -1 when not); green passed, red failed, grey not measured."""
    from circuitlab.v1 import reproduce_pb2 as rpb
    plt = _plt()
    r = client.get_reproduction(reproduction) if isinstance(reproduction, str) else reproduction
    comparisons = {}
    for scale in r.recipe.scales.values():
        for c in scale.checks:
            comparisons[c.id] = rpb.RecipeCheck.Comparison.Name(c.comparison)
    df = client.reproduction_df(r)
    checks = list(dict.fromkeys(df["check"]))
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.9 + 0.32 * max(1, len(checks))))
    for row, check in enumerate(checks):
        for _, m in df[df.check == check].iterrows():
            numeric = isinstance(m["value"], (int, float)) and isinstance(m["against"], (int, float)) \
                and not isinstance(m["value"], bool)
            sign = _DIRECTION.get(comparisons.get(check, ""), 0)
            if m["value"] is None:
                x, colour = 0.0, "0.6"
            else:
                x = _margin(float(m["value"]), float(m["against"]), sign) if numeric and sign \
                    else (1.0 if m["passed"] else -1.0)
                colour = "tab:green" if m["passed"] else "tab:red"
            ax.scatter([x], [row + (m["seed"] - (r.seeds + 1) / 2) * 0.12], color=colour, s=28, zorder=3)
    ax.axvline(0, color="0.3", lw=1)
    ax.set_xlim(-1.08, 1.08)
    ax.set_ylim(len(checks) - 0.5, -0.5)
    ax.set_yticks(range(len(checks)), checks, fontsize="small")
    ax.set_xlabel("margin in the claim's direction (right of 0: passes)")
    rep = r.report
    ax.set_title(f"{r.recipe_id} at {r.scale} scale, {r.seeds} seed(s): {rep.passed} passed, {rep.failed} failed, "
                 f"{rep.inconclusive} inconclusive" + (f", {rep.reported} reported only" if rep.reported else ""),
                 fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    ax.figure.tight_layout()
    return ax


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _figure_rows(df, fig):
    from google.protobuf.json_format import MessageToDict
    for axis, want in fig.where.items():
        df = df[df[axis] == MessageToDict(want)]
    return df


def plot_reproduction_figure(client, reproduction, index=0):
    """The paper's figure a recipe names (RecipeScale.figures[index]), drawn from the finished reproduction's
    tables: a label map per seed, a curve per seed against an axis (with the log-log fit and its slope), series
    over training (a line per run), or bars (the seeds' mean, each seed a dot). Returns the Figure."""
    plt = _plt()
    r = client.get_reproduction(reproduction) if isinstance(reproduction, str) else reproduction
    scale = r.recipe.scales[r.scale]
    if index >= len(scale.figures):
        raise IndexError(f"recipe {r.recipe_id} at {r.scale} names {len(scale.figures)} figure(s)")
    fig = scale.figures[index]
    kind = fig.Kind.Name(fig.kind).replace("KIND_", "")
    df = _figure_rows(client.reproduction_table_df(r, fig.sweep), fig)
    seeds = sorted(df["seed"].dropna().unique()) if "seed" in df else [None]
    legend = list(fig.legend) + list(fig.columns)[len(fig.legend):]
    if kind == "LABEL_MAP":
        column = fig.columns[0]
        labels = sorted({v for v in df[column] if isinstance(v, str) and v})
        cmap = plt.get_cmap("tab10", max(1, len(labels)))
        figure, axes = plt.subplots(1, len(seeds), figsize=(3.2 * len(seeds) + 2.2, 3.4), squeeze=False)
        for ax, seed in zip(axes[0], seeds):
            part = df[df["seed"] == seed] if seed is not None else df
            pivot = part.pivot_table(index=fig.y, columns=fig.x, values=column, aggfunc="first")
            codes = [[labels.index(v) if isinstance(v, str) and v in labels else math.nan for v in row]
                     for row in pivot.values.tolist()]
            ax.imshow(codes, origin="lower", cmap=cmap, vmin=-0.5, vmax=len(labels) - 0.5, aspect="auto")
            ax.set_xticks(range(len(pivot.columns)), [f"{c:g}" if _number(c) else str(c) for c in pivot.columns],
                          fontsize="x-small")
            ax.set_yticks(range(len(pivot.index)), [f"{c:g}" if _number(c) else str(c) for c in pivot.index],
                          fontsize="x-small")
            ax.set_xlabel(fig.x)
            ax.set_title(f"seed {int(seed)}" if seed is not None else "", fontsize="small")
        axes[0][0].set_ylabel(fig.y)
        from matplotlib.patches import Patch
        figure.legend(handles=[Patch(color=cmap(i), label=l) for i, l in enumerate(labels)], fontsize="small",
                      loc="center right", title=column)
        figure.subplots_adjust(right=1 - 2.0 / (3.2 * len(seeds) + 2.2), wspace=0.3)
    else:
        figure, ax = plt.subplots(figsize=(7, 4.2))
        colours = plt.get_cmap("tab10")
        if kind == "CURVE":
            for j, column in enumerate(fig.columns):
                for k, seed in enumerate(seeds):
                    part = df[df["seed"] == seed] if seed is not None else df
                    xy = sorted((x, y) for x, y in zip(part[fig.x], part[column]) if _number(x) and _number(y))
                    if not xy:
                        continue
                    name = legend[j] if k == 0 else None
                    ax.plot([p[0] for p in xy], [p[1] for p in xy], "o-", color=colours(j), alpha=0.8, label=name)
                if fig.fit:
                    pts = [(math.log(x), math.log(y)) for x, y in zip(df[fig.x], df[column])
                           if _number(x) and _number(y) and x > 0 and y > 0]
                    if len({p[0] for p in pts}) >= 2:
                        mx = sum(p[0] for p in pts) / len(pts)
                        my = sum(p[1] for p in pts) / len(pts)
                        slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
                        xs = sorted({p[0] for p in pts})
                        ax.plot([math.exp(x) for x in xs], [math.exp(my + slope * (x - mx)) for x in xs], "--",
                                color=colours(j), label=f"fit: slope {slope:.2f}")
            ax.set_xlabel(fig.x)
        elif kind == "SERIES":
            for j, column in enumerate(fig.columns):
                for k, (_, row) in enumerate(df.iterrows()):
                    series = row[column]
                    if not isinstance(series, list) or not series:
                        continue
                    if isinstance(series[0], list):  # [step, value] pairs
                        xs, ys = [p[0] for p in series], [p[1] for p in series]
                    else:  # a list of numbers, against its index
                        xs, ys = list(range(len(series))), series
                    ax.plot(xs, ys, color=colours(j), alpha=0.8, label=legend[j] if k == 0 else None)
            ax.set_xlabel(fig.x or "step")
        else:  # BARS
            for j, column in enumerate(fig.columns):
                values = [v for v in df[column] if _number(v)]
                if values:
                    ax.bar(j, sum(values) / len(values), color=colours(j), alpha=0.6)
                    ax.scatter([j] * len(values), values, color="0.2", s=14, zorder=3)
            ax.set_xticks(range(len(fig.columns)), legend, rotation=20, ha="right", fontsize="small")
            ax.axhline(0, color="0.4", lw=0.8)
        if fig.log_x:
            ax.set_xscale("log")
        if fig.log_y:
            ax.set_yscale("log")
        ax.set_ylabel(fig.y_title)
        if kind != "BARS":
            ax.legend(fontsize="small", loc="best")
        ax.grid(alpha=0.3)
    figure.suptitle(f"{r.recipe_id} ({r.scale}, {r.seeds} seed(s)): {fig.title}", fontsize="medium")
    if kind != "LABEL_MAP":
        figure.tight_layout()
    return figure
