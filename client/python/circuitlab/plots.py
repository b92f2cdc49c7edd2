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


def plot_coordinates(client, runs, names=("alpha", "beta", "gamma", "delta"), rho=True, ax=None):
    """The IMIR coordinates over training (and rho, the off-manifold residual, on a second axis)."""
    ax = _axes(ax)
    df = client.coordinates_df(runs, names)
    for (run_id, name), g in df.groupby(["run_id", "name"], sort=True):
        ax.plot(g["step"], g["value"], label=f"{run_id} {name}")
    ax.set_xlabel("step")
    ax.set_ylabel("coordinate")
    if rho:
        m = client.metrics_df(runs, ["manifold/rho"])
        if len(m):
            ax2 = ax.twinx()
            for run_id, g in m.groupby("run_id"):
                ax2.plot(g["step"], g["value"], linestyle="--", color="grey", label=f"{run_id} rho")
            ax2.set_ylabel("rho (dashed)")
    ax.legend(fontsize="small")
    return ax


def plot_phase_diagram(client, sweep_id, x, y, value, aggregate=None, ax=None):
    """A sweep's pivot as a map: text values (circuit labels) as colours with a legend, numbers as a
    heatmap with a colour bar."""
    plt = _plt()
    ax = _axes(ax)
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
                  bbox_to_anchor=(1.02, 1), loc="upper left")
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
