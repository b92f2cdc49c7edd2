"""Every method of circuitlab.Client once, against a real server; errors map to the right class;
configuration from the environment; the installed stubs match the protos."""
import glob
import json
import os
import subprocess
import tempfile

import grpc
import pytest

import circuitlab
from circuitlab.v1 import analysis_service_pb2 as apb
from circuitlab.v1 import experiment_service_pb2 as pb
from conftest import REPO, TINY, ServerProcess

LATENT = {"name": "py-dice", "seed": 4, "task": {"latent": {"kind": "LATENT_KIND_DICE", "seq_len": 16}},
          "model": {"decoder": {"num_layers": 1, "d_model": 16, "num_heads": 2}},
          "training": {"steps": 30}, "recording": {"eval_size": 32}}


def test_specs_from_every_form(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(TINY))
    forms = [TINY, json.dumps(TINY), str(path), path, circuitlab.spec(TINY)]
    specs = [circuitlab.spec(f) for f in forms]
    assert all(s == specs[0] for s in specs)
    assert specs[0].training.steps == 80
    assert circuitlab.spec(TINY, seed=3).seed == 3
    with pytest.raises(circuitlab.InvalidArgument, match="no_such_field"):
        circuitlab.spec({"no_such_field": 1})
    with pytest.raises(TypeError):
        circuitlab.spec(42)


def test_runs_watch_metrics_and_delete(client):
    assert client.health()
    me = client.whoami()
    assert (me.principal, me.role) == ("local", "admin")
    assert client.workers().executor == "local"
    run = client.submit(TINY, name="py-watch")
    assert run.state == pb.RUN_STATE_QUEUED
    events = list(client.watch(run.run_id, include_metrics=True))
    assert events[0].HasField("snapshot")
    assert events[-1].state.state == pb.RUN_STATE_SUCCEEDED
    assert any(e.HasField("metrics") for e in events)
    assert client.get_run(run.run_id).state == pb.RUN_STATE_SUCCEEDED
    m = client.metrics(run.run_id, names=["train/loss", "eval/icl_rare/accuracy"])
    by = {s.name: s for s in m.series}
    assert list(by["train/loss"].steps) == list(range(10, 81, 10))
    assert list(by["eval/icl_rare/accuracy"].steps) == [0, 40, 80]
    assert run.run_id in [r.run_id for r in client.list_runs(tags=["py"], states=["succeeded"])]
    t = client.trajectory(run.run_id, names=["alpha", "beta"])
    assert [s.coordinate.canonical for s in t.series] == ["alpha", "beta"]
    deleted = client.delete_run(run.run_id)
    assert deleted.freed_bytes > 0
    with pytest.raises(circuitlab.NotFound):
        client.get_run(run.run_id)


def test_list_runs_pages_lazily(client, trained):
    pages = client.list_runs(page_size=2)
    first = next(pages)  # one page fetched, not all
    assert first.run_id
    everything = client.runs()
    assert len(list(client.list_runs(page_size=2))) == len(everything) >= 6


def test_cancel(client):
    run = client.submit(TINY, name="py-cancel", training=dict(TINY["training"], steps=1000000))
    cancelled = client.cancel_run(run.run_id)
    assert cancelled.run_id == run.run_id
    assert client.wait(run.run_id, deadline=60).state == pb.RUN_STATE_CANCELLED
    with pytest.raises(circuitlab.Timeout):
        client.wait(client.submit(TINY, training=dict(TINY["training"], steps=1000000)).run_id, deadline=0.1)
    for r in client.runs(states=["running", "queued"]):
        client.cancel_run(r.run_id)


def test_sweeps(client, trained):
    sweep = client.get_sweep(trained["sweep"])
    assert sweep.done and len(sweep.run_ids) == 4
    s = client.sweep_summary(trained["sweep"], values=["train/loss"], pivot=("lr", "seed", "train/loss"))
    assert list(s.axes) == ["lr", "seed"] and len(s.rows) == 4
    assert len(s.pivot.cells) == 4
    extra = client.submit_sweep({"name": "py-cancel-sweep", "base": dict(TINY, training={"steps": 1000000}),
                                 "axes": [{"field": "seed", "values": [1, 2]}]})
    assert client.cancel_sweep(extra.sweep_id).sweep_id == extra.sweep_id
    for r in extra.run_ids:
        client.wait(r, deadline=60)
    assert client.delete_sweep(extra.sweep_id).sweep_id == extra.sweep_id


def test_analyses_wait_for_their_jobs(client, trained):
    run_id = trained["runs"][0]
    seen = []
    proj = client.project_checkpoint(run_id, progress=lambda f, r: seen.append(f))
    assert proj.state == apb.ANALYSIS_STATE_DONE and len(proj.coordinates) > 0
    assert seen and seen[-1] == 1.0
    ablate = {"interventions": [{"op": "OP_ABLATE_HEAD", "layer": 1, "head": 1}], "eval_sets": ["icl_rare"]}
    effects = client.intervene(ablate, run_id=run_id).effects
    assert effects and effects[0].eval_set == "icl_rare"
    intervened = client.intervene(os.path.join(REPO, "examples", "intervene_imir_hooks.json"), run_id=run_id)
    assert intervened.state == apb.ANALYSIS_STATE_DONE
    label = client.label_run(run_id)
    assert label.label
    assert client.label_run(run_id).from_store
    circuit = client.detect_circuit(run_id)
    assert circuit.state == apb.ANALYSIS_STATE_DONE
    inv = client.check_invariance(run_id=run_id, sample_sizes=[64, 256])
    assert inv.state == apb.ANALYSIS_STATE_DONE
    dd = client.check_data_dependence(run_id=run_id, samples=256)
    assert dd.state == apb.ANALYSIS_STATE_DONE
    att = client.attention_patterns(run_id, sequences=1)
    assert att.state == apb.ANALYSIS_STATE_DONE and att.eval_set == "icl_rare"
    assert {p.name for p in att.patterns} >= {"L1H1"} and len(att.sequences) == 1
    with pytest.raises(circuitlab.InvalidArgument, match="sequences"):
        client.attention_patterns(run_id, sequences=17)
    assert len(client.analysis_jobs().jobs) == 0
    with pytest.raises(circuitlab.NotFound):
        client.cancel_analysis("a999")


def test_task_vectors(client):
    run = client.submit(LATENT)
    assert client.wait(run.run_id, deadline=120).state == pb.RUN_STATE_SUCCEEDED
    resp = client.analyze_task_vectors(run.run_id, analyses=["ood_r2", "p0"], samples_per_cell=16)
    names = {v.name for v in resp.values}
    assert {"ood_r2/code", "p0/resid_ratio"} <= names
    assert client.analyze_task_vectors(run.run_id, analyses=["ood_r2", "p0"], samples_per_cell=16).from_store
    df = client.task_vectors_df(run.run_id, analyses=["ood_r2", "p0"], samples_per_cell=16)
    assert len(df) == len(resp.values)
    assert str(df["value"].dtype) == "float64" and str(df["layer"].dtype) == "int64"
    with pytest.raises(circuitlab.InvalidArgument, match="p9"):
        client.analyze_task_vectors(run.run_id, analyses=["p9"])
    # Attention patterns of the decoder: rows of the (query x key) heatmap sum to 1 over keys <= query.
    att = client.attention_df(run.run_id, sequences=2, layers=[1], heads=[2])
    assert set(att["name"]) == {"L1H2"} and set(att["sequence"]) == {0, 1}
    assert set(att["layer"]) == {1} and set(att["head"]) == {2}
    sums = att.groupby(["sequence", "query"])["weight"].sum()
    assert ((sums - 1.0).abs() < 1e-4).all()
    assert att.attrs["eval_set"] == "id"


def test_errors_map_to_classes(client):
    bad = circuitlab.spec(TINY)
    bad.task.associative_recall.num_blocks = 0
    with pytest.raises(circuitlab.InvalidArgument) as e:
        client.submit(bad)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "task.associative_recall.num_blocks must be in [1, 256], got 0" in e.value.message
    with pytest.raises(circuitlab.NotFound):
        client.get_run("r999")
    with pytest.raises(circuitlab.FailedPrecondition):
        client.delete_run(client.submit(TINY, training={"steps": 1000000}).run_id)  # still queued or running
    with pytest.raises(circuitlab.CircuitlabError):
        client.get_sweep("s999")
    assert issubclass(circuitlab.Unavailable, circuitlab.CircuitlabError)
    with pytest.raises(circuitlab.Unavailable):
        circuitlab.Client("127.0.0.1:1", timeout=2).get_run("r1")


def test_every_service_answers_health(client, tmp_path):
    """Issue 51 item 12: each registered service answers by its full name; WorkerService serves only on
    a server with remote workers (NOT_SERVING otherwise, never NOT_FOUND)."""
    from conftest import ServerProcess
    names = ["circuitlab.v1." + s for s in ("ExperimentService", "AnalysisService", "ReproductionService")]
    assert client.health() and all(client.health(n) for n in names)
    assert not client.health("circuitlab.v1.WorkerService")
    with pytest.raises(circuitlab.NotFound):
        client.health("circuitlab.v1.NoSuchService")
    remote = ServerProcess(str(tmp_path / "data"), "--executor", "workers")
    try:
        with circuitlab.Client(remote.target, timeout=20) as c:
            assert all(c.health(n) for n in names + ["circuitlab.v1.WorkerService"])
    finally:
        remote.stop()


def test_environment_configuration_tls_and_token(tmp_path, monkeypatch):
    scripts = os.path.join(REPO, "scripts")
    subprocess.run([os.path.join(scripts, "dev-certs.sh"), str(tmp_path / "certs")], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([os.path.join(scripts, "add-principal.sh"), "ada", "reader", str(tmp_path / "tokens.txt"),
                    str(tmp_path)], check=True, stdout=subprocess.DEVNULL)
    s = ServerProcess(str(tmp_path / "data"), "--tls-cert", str(tmp_path / "certs" / "server.pem"),
                      "--tls-key", str(tmp_path / "certs" / "server.key"),
                      "--auth-tokens-file", str(tmp_path / "tokens.txt"))
    try:
        monkeypatch.setenv("CIRCUITLAB_TARGET", s.target)
        monkeypatch.setenv("CIRCUITLAB_CA_CERT", str(tmp_path / "certs" / "ca.pem"))
        monkeypatch.setenv("CIRCUITLAB_TOKEN_FILE", str(tmp_path / "ada.token"))
        c = circuitlab.Client(timeout=10)
        me = c.whoami()
        assert (me.principal, me.role, me.tls) == ("ada", "reader", True)
        with pytest.raises(circuitlab.PermissionDenied):
            c.submit(TINY)
        token = (tmp_path / "ada.token").read_text().splitlines()[0].strip()
        monkeypatch.delenv("CIRCUITLAB_TOKEN_FILE")
        monkeypatch.setenv("CIRCUITLAB_TOKEN", token)
        assert circuitlab.Client(timeout=10).whoami().principal == "ada"
        monkeypatch.setenv("CIRCUITLAB_TOKEN", "wrong")
        with pytest.raises(circuitlab.Unauthenticated):
            circuitlab.Client(timeout=10).runs()
        with pytest.raises(circuitlab.Unavailable):
            circuitlab.Client(s.target, ca_cert="", timeout=5).runs()  # plaintext to a TLS port
    finally:
        s.stop()


def test_installed_stubs_match_the_protos(tmp_path):
    """The package's generated modules describe exactly the files in proto/ (protoc's descriptors)."""
    from google.protobuf import descriptor_pb2
    from circuitlab.v1 import spec_pb2, experiment_service_pb2, analysis_service_pb2, worker_service_pb2, reproduce_pb2
    assert os.path.dirname(circuitlab.__file__) != os.path.join(REPO, "client", "python", "circuitlab"), \
        "the test must run against the installed package"
    out = tmp_path / "set.pb"
    protos = sorted(os.path.relpath(p, os.path.join(REPO, "proto"))
                    for p in glob.glob(os.path.join(REPO, "proto", "circuitlab", "v1", "*.proto")))
    subprocess.run(["protoc", f"-I{os.path.join(REPO, 'proto')}", f"--descriptor_set_out={out}", *protos], check=True)
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())

    def without_json_names(messages):  # derived from the field names; CopyToProto leaves them out
        for m in messages:
            for f in m.field:
                f.ClearField("json_name")
            without_json_names(m.nested_type)

    for f in fds.file:
        without_json_names(f.message_type)
    expected = {f.name: f for f in fds.file}
    modules = {m.DESCRIPTOR.name: m
               for m in (spec_pb2, experiment_service_pb2, analysis_service_pb2, worker_service_pb2, reproduce_pb2)}
    assert set(modules) == set(expected), "a proto without a stub (or the reverse)"
    for name, module in modules.items():
        got = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(got)
        assert got == expected[name], f"{name}: the installed stub differs from proto/{name}"


def test_reproductions(client, tmp_path_factory):
    """A recipe of one's own (two tiny runs, a label analysis, three checks) carried to its report, as a
    DataFrame; the compiled-in recipes are listed; errors name the field."""
    from circuitlab.v1 import reproduce_pb2 as rpb
    ids = [r.id for r in client.recipes().recipes]
    assert "E.9" in ids
    with pytest.raises(circuitlab.InvalidArgument, match="scale must be one of"):
        client.reproduce("E.9", scale="gpu")
    recipe = {"id": "PY.1", "title": "tiny", "scales": {"ci": {
        "sweeps": [{"name": "tiny", "sweep": {"base": dict(TINY, training=dict(TINY["training"], steps=40)),
                                              "axes": [{"field": "training.learning_rate", "name": "lr",
                                                        "values": [1, 4]}]}}],
        "analyses": [{"name": "label", "sweep": "tiny", "label_run": {}}],
        "checks": [
            {"id": "trained", "value": {"column": {"sweep": "tiny", "column": "train/loss", "reduce": "REDUCE_COUNT"}},
             "comparison": "COMPARISON_EQ", "against": {"constant": 2}},
            {"id": "labelled", "value": {"column": {"sweep": "tiny", "column": "label.label", "reduce": "REDUCE_COUNT"}},
             "comparison": "COMPARISON_EQ", "against": {"constant": 2}},
            {"id": "impossible", "value": {"column": {"sweep": "tiny", "column": "train/loss", "reduce": "REDUCE_MIN"}},
             "comparison": "COMPARISON_LT", "against": {"constant": 0}}],
        "figures": [
            {"title": "the final loss against lr", "kind": "KIND_CURVE", "sweep": "tiny", "x": "lr",
             "columns": ["train/loss"], "log_x": True, "log_y": True, "fit": True},
            {"title": "the loss over training", "kind": "KIND_SERIES", "sweep": "tiny", "columns": ["series:train/loss"]},
            {"title": "the final loss", "kind": "KIND_BARS", "sweep": "tiny", "columns": ["train/loss", "train/accuracy"],
             "legend": ["loss", "accuracy"]}]}}}
    seen = []
    r = client.reproduce(recipe, seeds=2, progress=lambda f, resp: seen.append(f), deadline=300, poll=0.5)
    assert r.state == rpb.REPRODUCTION_STATE_DONE, (r.phase, r.error)
    assert seen and seen[-1] == 1.0
    assert (r.report.passed, r.report.failed) == (2, 1)
    df = client.reproduction_df(r.reproduction_id)
    assert list(df["seed"].unique()) == [1, 2]
    assert set(df["check"]) == {"trained", "labelled", "impossible"}
    assert df[df.check == "impossible"]["outcome"].unique().tolist() == ["FAIL"]
    table = client.reproduction_table_df(r, "tiny")
    assert len(table) == 4 and {"lr", "seed", "train/loss", "label.label"} <= set(table.columns)
    listed = client.reproductions()[0]
    assert listed.reproduction_id == r.reproduction_id
    assert not listed.HasField("recipe") and listed.report.passed == 2 and not listed.report.checks
    full = client.reproductions(full=True, limit=1)
    assert len(full) == 1 and full[0].recipe.id and len(full[0].report.checks) == 3
    import matplotlib
    matplotlib.use("Agg")
    ax = client.plot_reproduction(r)
    # one dot per check and seed: two passes and the impossible check failing on both seeds
    colours = [tuple(c.get_facecolor()[0][:3]) for c in ax.collections]
    assert len(colours) == 6
    red = matplotlib.colors.to_rgb("tab:red")
    assert sum(c == red for c in colours) == 2
    assert [t.get_text() for t in ax.get_yticklabels()] == ["trained", "labelled", "impossible"]
    ax.figure.savefig(str(tmp_path_factory.mktemp("fig") / "report.png"))
    # The recipe's own figures (issue 50): a curve per seed with its fit, a line per run, bars with seed dots.
    curve = client.plot_reproduction_figure(r, 0)
    lines = curve.axes[0].get_lines()
    assert len(lines) == 3 and lines[2].get_label().startswith("fit: slope ")
    assert curve.axes[0].get_xscale() == "log" and "the final loss against lr" in curve._suptitle.get_text()
    series = client.plot_reproduction_figure(r, 1).axes[0].get_lines()
    assert len(series) == 4 and all(len(l.get_xdata()) > 1 for l in series)
    bars = client.plot_reproduction_figure(r, 2).axes[0]
    assert len(bars.patches) == 2 and [t.get_text() for t in bars.get_xticklabels()] == ["loss", "accuracy"]
    assert len(bars.collections) == 2 and all(len(c.get_offsets()) == 4 for c in bars.collections)
    with pytest.raises(IndexError):
        client.plot_reproduction_figure(r, 3)
    curve.savefig(str(tmp_path_factory.mktemp("fig") / "figure.png"))


def test_messages_print_as_utf8():
    """print(answer) shows labels as text, not protobuf's octal escapes (issue 46)."""
    import circuitlab
    r = circuitlab.analysis_service_pb2.DetectCircuitResponse()
    r.circuit.add().coordinate.label = "β L2H1"
    assert 'label: "β L2H1"' in str(r), str(r)
    nested = circuitlab.reproduce_pb2.Recipe(title="ρ → 0")
    assert "ρ → 0" in str(nested)
