"""DataFrame shapes and dtypes; plots render to PNG files (Agg) with content."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def test_runs_df(client, trained):
    df = client.runs_df(tags=["py"], state=["succeeded"])
    assert set(trained["runs"] + trained["members"]) <= set(df["run_id"])
    for col in ["run_id", "state", "name", "sweep_id", "created", "owner", "step", "total_steps",
                "config.training.learning_rate", "config.seed", "metrics.train/loss",
                "metrics.eval/icl_rare/accuracy"]:
        assert col in df.columns, col
    assert str(df["step"].dtype) == "int64"
    assert str(df["created"].dtype).startswith("datetime64")
    assert (df["state"] == "succeeded").all()
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
