"""GetLogitLens, the analysis added to show the fronts defined once (issue 47): its proto messages and two
server files, and nothing else, make it callable from Python (client.logit_lens and logit_lens_df, from the
AnalysisService descriptor), from the CLI (`circuitlab logit-lens`, its flags from the request's fields and
their help from the proto's comments) and over HTTP (/api/v1/runs/{id}/analyses/logit-lens, GET and POST).

The science: on the README's demo run (examples/induction.json, an induction circuit over two layers) the
answer is read out only after layer 2 -- the embeddings and the stream after layer 1 rank it first on
0.023 and 0.055 of the queries, the whole model on 0.98 (measured, 256 sequences of icl_rare) -- so the
test asks the last layer for >= 0.9 and the earlier ones for <= 0.2."""
import csv
import io
import json
import subprocess
import time
import urllib.request

import pytest

import circuitlab
from test_models import CLI, decoder_run  # noqa: F401 (a fixture)
from test_prompts import demo  # noqa: F401 (a fixture)


def test_python_logit_lens_forms_at_the_induction_layer(client, demo):  # noqa: F811
    lens = client.logit_lens(demo, sequences=256)
    assert (lens.run_id, lens.eval_set, lens.sequences, lens.predictions) == (demo, "icl_rare", 256, 256)
    assert [(row.layer, row.point) for row in lens.layers] == [(0, "embed"), (1, "L1.resid"), (2, "L2.resid")]
    embed, first, last = lens.layers
    assert last.accuracy >= 0.9 and last.agreement == 1.0 and last.kl_to_final < 1e-6
    assert embed.accuracy <= 0.2 and first.accuracy <= 0.2
    assert last.loss < first.loss and last.target_prob > 4 * first.target_prob
    df = client.logit_lens_df(demo, sequences=256)
    assert list(df.columns) == ["run_id", "step", "eval_set", "sequences", "predictions", "layer", "point", "loss",
                                "accuracy", "target_prob", "agreement", "kl_to_final"]
    assert list(df["accuracy"]) == [row.accuracy for row in lens.layers] and set(df["run_id"]) == {demo}
    assert client.logit_lens(demo, sequences=256).from_store


def test_a_decoder_runs_lens_reads_every_next_token(client, decoder_run):  # noqa: F811
    lens = client.logit_lens(decoder_run, sequences=32)
    layers = client.get_run(decoder_run).spec.model.decoder.num_layers
    assert lens.eval_set == "id" and [row.point for row in lens.layers] == [
        "embed", *(f"L{l}.post_mlp" for l in range(1, layers + 1))]
    assert lens.predictions > 32 and lens.layers[-1].agreement == 1.0 and lens.layers[-1].kl_to_final < 1e-6
    assert lens.layers[0].kl_to_final > lens.layers[-1].kl_to_final


def test_bounds_name_the_field(client, demo):  # noqa: F811
    with pytest.raises(circuitlab.errors.InvalidArgument, match="sequences must be in"):
        client.logit_lens(demo, sequences=5000)
    with pytest.raises(circuitlab.errors.InvalidArgument, match="eval_set"):
        client.logit_lens(demo, eval_set="nope")


def test_the_cli_verb_comes_from_the_descriptor(client, demo, server):  # noqa: F811
    stored = client.logit_lens(demo, sequences=256)
    cli = [CLI, "--server", server.target]
    out = subprocess.run(cli + ["logit-lens", demo, "--sequences", "256", "--csv"], capture_output=True, text=True,
                         check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [float(r["accuracy"]) for r in rows] == pytest.approx([row.accuracy for row in stored.layers], rel=1e-5)
    assert {r["run_id"] for r in rows} == {demo} and [r["point"] for r in rows] == ["embed", "L1.resid", "L2.resid"]
    table = subprocess.run(cli + ["logit-lens", demo, "--sequences", "256"], capture_output=True, text=True,
                           check=True).stdout
    assert "(stored answer)" in table and "KL_TO_FINAL" in table
    helped = subprocess.run(cli + ["logit-lens", "--help"], capture_output=True, text=True, check=True).stdout
    assert "The logit lens" in helped and "Sequences scored, in [1, 4096]" in helped  # the proto's comments
    bad = subprocess.run(cli + ["logit-lens", demo, "--sequences", "many"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--sequences expects a non-negative integer" in bad.stderr


def _http(url, body=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_http_routes_come_from_the_analysis_table(client, demo, server):  # noqa: F811
    url = f"{server.http}/api/v1/runs/{demo}/analyses/logit-lens"
    stored = client.logit_lens(demo, sequences=256)
    got = _http(url + "/stored?sequences=256")
    assert got["from_store"] and [layer["accuracy"] for layer in got["layers"]] == [
        row.accuracy for row in stored.layers]
    assert "none stored" in _http(url + "/stored?sequences=17")["error"]
    # POST starts one with any request field; asking again reports on the same job until it is DONE.
    for _ in range(100):
        answer = _http(url, {"sequences": 64, "eval_set": "icl_rare", "seed": 5})
        if answer["state"] == "ANALYSIS_STATE_DONE":
            break
        assert answer["run_id"] == demo  # a pending answer echoes the run
        time.sleep(0.1)
    assert answer["state"] == "ANALYSIS_STATE_DONE" and answer["sequences"] == 64 and len(answer["layers"]) == 3
