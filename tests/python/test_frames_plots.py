"""DataFrame shapes and dtypes; plots render to PNG files (Agg) with content."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def test_runs_df(client, trained):
    df = client.runs_df(tags=["py"], state=["succeeded"])
    assert set(trained["runs"] + trained["members"]) <= set(df["run_id"])
    for col in ["run_id", "state", "name", "sweep_id", "created", "owner", "device", "packed_with", "step", "total_steps",
                "config.training.learning_rate", "config.seed", "metrics.train/loss",
                "metrics.eval/icl_rare/accuracy"]:
        assert col in df.columns, col
    assert str(df["step"].dtype) == "int64"
    assert str(df["created"].dtype).startswith("datetime64")
    assert (df["state"] == "succeeded").all()
    assert df["device"].str.startswith("cpu:").all() and (df["packed_with"] == "").all()  # CPU: no packs by default
    members = client.runs_df(sweep=trained["sweep"])
    assert sorted(members["run_id"]) == sorted(trained["members"])
    assert sorted(members["config.training.learning_rate"].unique()) == [1.0, 4.0]


def test_metrics_and_coordinates_df(client, trained):
    m = client.metrics_df(trained["runs"], ["train/loss", "eval/icl_rare/accuracy"])
    assert list(m.columns) == ["run_id", "name", "step", "value"]
    assert [str(t) for t in m.dtypes] == ["string", "string", "int64", "float64"]
    assert len(m) == 2 * (8 + 3)  # two runs: 8 loss points, 3 evaluations
    c = client.coordinates_df(trained["runs"][0])
    assert list(c.columns) == ["run_id", "name", "label", "step", "value"]
    assert set(c["name"]) == {"alpha", "beta", "gamma", "delta"}
    assert str(c["step"].dtype) == "int64" and str(c["value"].dtype) == "float64"


def test_patch_df(client, trained):
    run = trained["runs"][0]
    df = client.patch_df(run, ["L1.H1.out", "L2.attn"], reference_set="iwl", positions=[0, 5],
                         eval_sets=["icl_rare"], n_eval=64)
    assert list(df.columns) == ["eval_set", "hook", "position", "accuracy", "loss", "logit_diff",
                                "effect_accuracy", "effect_loss", "effect_logit_diff"]
    assert list(df["position"]) == [0, 5, -1, 0, 5, -1]
    assert list(df["hook"]) == ["L1.H1.out"] * 3 + ["L2.attn"] * 3
    base, source = df.attrs["base"]["icl_rare"], df.attrs["source"]["icl_rare"]
    if abs(source["loss"] - base["loss"]) > 1e-9:
        expected = (df["loss"] - base["loss"]) / (source["loss"] - base["loss"])
        assert np.allclose(df["effect_loss"], expected, atol=1e-9)


def test_sweep_summary_df(client, trained):
    rows = client.sweep_summary_df(trained["sweep"], values=["train/loss"])
    assert list(rows.columns) == ["run_id", "state", "lr", "seed", "train/loss"]
    assert len(rows) == 4
    assert str(rows["train/loss"].dtype) == "Float64"
    p = client.sweep_summary_df(trained["sweep"], pivot=("lr", "seed", "train/loss"))
    assert p.shape == (2, 2)
    assert list(p.columns) == [1, 4] and list(p.index) == [1, 2]
    assert p.columns.name == "lr" and p.index.name == "seed"


def _painted(path):
    img = plt.imread(path)
    return (img[..., :3].std(axis=2) > 0.05).sum()  # coloured (non-grey) pixels


def test_plots_render(client, trained, tmp_path):
    ax = client.plot_metrics(trained["runs"], ["train/loss"], logy=True, smooth=0.5)
    assert len(ax.get_lines()) == 2 and ax.get_yscale() == "log"
    ax.figure.savefig(tmp_path / "metrics.png")
    assert _painted(tmp_path / "metrics.png") > 500
    ax = client.plot_coordinates(trained["runs"][0])
    assert len(ax.get_lines()) == 4
    ax.figure.savefig(tmp_path / "coords.png")
    assert _painted(tmp_path / "coords.png") > 500
    ax = client.plot_phase_diagram(trained["sweep"], "lr", "seed", "train/loss")
    data = ax.get_images()[0].get_array()
    assert data.shape == (2, 2) and np.isfinite(np.asarray(data, dtype=float)).all()
    ax.figure.savefig(tmp_path / "phase.png")
    assert _painted(tmp_path / "phase.png") > 500
    plt.close("all")


def test_two_runs_coordinates_are_coloured_by_run_and_styled_by_coordinate(client, trained, tmp_path):
    import matplotlib.colors as mcolors
    ax = client.plot_coordinates(trained["runs"])
    lines = ax.get_lines()
    assert len(lines) == 8
    colours = {mcolors.to_hex(l.get_color()) for l in lines}
    assert len(colours) == 2, colours  # one per run
    by_run = {}
    for l in lines:
        run, name = l.get_label().split(" ", 1)
        by_run.setdefault(run, []).append((name, l.get_linestyle()))
    assert sorted(by_run) == sorted(trained["runs"])
    styles = [dict(v) for v in by_run.values()]
    assert styles[0] == styles[1] and len(set(styles[0].values())) == 4, styles  # one style per coordinate
    legend = ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    rho = [t for t in texts if t.endswith(" ρ")]
    m = client.metrics_df(trained["runs"], ["manifold/rho"])
    assert len(rho) == (2 if len(m) else 0), texts  # each run's rho named in the one legend
    ax.figure.savefig(tmp_path / "coords2.png")
    plt.close("all")


def test_phase_diagram_legend_stays_inside_the_saved_image(tmp_path):
    """The label map's legend sits beside the map; saved as the tutorial says (ax.figure.savefig), it is
    inside the image."""
    import pandas as pd
    from circuitlab import plots

    class Labels:
        def sweep_summary_df(self, sweep_id, pivot):
            return pd.DataFrame([["pair_1_2", "pair_1_3", "in_weights_memory"], ["pair_1_2", "none", "pair_2_3"]],
                                index=[1, 2], columns=[0.5, 1, 2])

    ax = plots.plot_phase_diagram(Labels(), "s1", "lr", "seed", "pair")
    fig = ax.figure
    fig.savefig(tmp_path / "phase.png")
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and 0 <= box.y0 and box.y1 <= fig.bbox.y1, (box, fig.bbox)
    assert len(ax.get_legend().get_texts()) == 5
    plt.close("all")
