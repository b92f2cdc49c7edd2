"""Weights out and activations in (issue 46): a model exported by the server and loaded in PyTorch
computes what the server's engine computes, at every hook point, on sequences written here; the CLI's
export writes the same file; the requests' bounds answer INVALID_ARGUMENT naming the field."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch

import circuitlab
from circuitlab.v1 import experiment_service_pb2 as pb
from conftest import REPO
from test_client import LATENT

CLI = os.environ.get("CIRCUITLAB_CLI_BIN", os.path.join(REPO, "build", "client", "circuitlab"))


def close(a, b):
    """Equal to float32 rounding: |a - b| <= 1e-5 + 1e-5 |b| elementwise."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return np.allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def decoder_run(client):
    run = client.submit(LATENT, name="py-dice-export")
    assert client.wait(run.run_id, deadline=120).state == pb.RUN_STATE_SUCCEEDED
    return run.run_id


def test_imir_model_matches_the_engine_at_every_hook(client, trained):
    run = trained["runs"][0]
    model = client.load_model(run)
    cfg = model.config
    assert cfg["family"] == "imir" and cfg["layers"] == 2 and cfg["spec"]["seed"] == "9"
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg["vocab"], size=(3, 12))
    positions = rng.integers(0, cfg["positions"], size=(3, 12))
    hooks = ["embed", "L1.attn", "L1.H1.out", "L1.resid", "L2.attn", "L2.resid", "logits"]
    server = client.activations(run, tokens.tolist(), hooks, positions=positions.tolist())
    assert list(server) == hooks
    with torch.no_grad():
        logits, cache = model.run_with_cache(torch.tensor(tokens), torch.tensor(positions))
    for h in hooks:
        assert close(cache[h].numpy(), server[h]), h
    assert server["L2.attn"].shape == (3, 1, 12, 12)  # batch, head, query, key
    assert close(logits.numpy(), server["logits"])
    # The same on the task's own sequences (from an attention analysis), with position ids cycling
    # through the block offsets.
    att = client.attention_patterns(run, sequences=2, layers=[1], heads=[1])
    seq = [list(s.tokens) for s in att.sequences]
    pos = [[t % 2 for t in range(len(s))] for s in seq]
    assert close(model(torch.tensor(seq), torch.tensor(pos)).detach().numpy(),
                 client.activations(run, seq, "logits", positions=pos)["logits"])


def test_decoder_model_matches_the_engine_at_every_hook(client, decoder_run):
    model = client.load_model(decoder_run)
    cfg = model.config
    assert cfg["family"] == "latent" and cfg["layers"] == 1 and cfg["d_model"] == 16
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg["vocab"], size=(4, 16))
    hooks = ["embed", "L1.resid_pre", "L1.attn.pattern", "L1.attn.head", "L1.post_attn", "L1.post_mlp", "logits"]
    server = client.activations(decoder_run, tokens.tolist(), hooks)
    with torch.no_grad():
        logits, cache = model.run_with_cache(torch.tensor(tokens))
    for h in hooks:
        assert close(cache[h].numpy(), server[h]), h
    assert server["L1.attn.head"].shape == (4, 16, 2, 8)  # batch, position, head, d_head
    assert close(logits.numpy(), server["logits"])
    df = client.activations_df(decoder_run, tokens[:1].tolist(), ["L1.attn.pattern"])
    assert len(df) == 2 * 16 * 16 and set(df["hook"]) == {"L1.attn.pattern"}
    rows = df.groupby(["axis1", "axis2"])["value"].sum()  # each (head, query) row sums to 1
    assert ((rows - 1.0).abs() < 1e-5).all()


def test_cli_export_writes_the_same_file(client, trained, server, tmp_path):
    run = trained["runs"][1]
    out = tmp_path / "m.safetensors"
    done = subprocess.run([CLI, "--server", server.target, "export", run, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "weights ->" in done.stdout
    config = json.loads((tmp_path / "m.json").read_text())
    assert config["family"] == "imir"
    assert out.read_bytes() == client.export_weights(run).safetensors
    tensors, meta = circuitlab.read_safetensors(out.read_bytes())
    assert sorted(tensors) == ["L1.kq", "L2.kq", "out"] and json.loads(meta["config"]) == config
    model = circuitlab.load_model(str(out))
    assert torch.equal(model.out.detach(), tensors["out"])


def test_bounds_answer_invalid_argument(client, trained, decoder_run):
    run = trained["runs"][0]
    with pytest.raises(circuitlab.InvalidArgument, match=r"sequences\[0\]\.positions must have one position id"):
        client.activations(run, [[1, 2, 3]])
    with pytest.raises(circuitlab.InvalidArgument, match=r"tokens\[1\] must be in \[0, "):
        client.activations(run, [[1, 999, 3]], positions=[[0, 1, 0]])
    with pytest.raises(circuitlab.InvalidArgument, match=r"hooks\[0\] 'L0.attn' is not a hook point of this IMIR"):
        client.activations(run, [[1, 2]], "L0.attn", positions=[[0, 1]])
    with pytest.raises(circuitlab.InvalidArgument, match="same length"):
        client.activations(run, [[1, 2], [1, 2, 3]], positions=[[0, 1], [0, 1, 0]])
    with pytest.raises(circuitlab.InvalidArgument, match="sequences must have 1 to 64"):
        client.activations(run, [[1]] * 65, positions=[[0]] * 65)
    with pytest.raises(circuitlab.InvalidArgument, match="context length"):
        client.activations(decoder_run, [[1] * 17])
    with pytest.raises(circuitlab.InvalidArgument, match="implicit"):
        client.activations(decoder_run, [[1, 2]], positions=[[0, 1]])
    with pytest.raises(circuitlab.NotFound):
        client.export_weights("r9999")


def test_compare_and_a_sweeps_curves(client, trained, server):
    a, b = trained["runs"]
    done = subprocess.run([CLI, "--server", server.target, "compare", a, b, "--csv"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split(",") for line in done.stdout.splitlines()]
    assert rows[0] == ["section", "key", a, b]
    assert ["run", "name", "py-tiny", "py-tiny-b"] in rows
    assert ["spec", "seed", "9", "10"] in rows
    assert [r[1] for r in rows if r[0] == "spec"] == ["seed"]  # nothing else differs
    assert any(r[:2] == ["metric", "train/loss"] and r[2] != r[3] for r in rows)
    df = client.metrics_df(sweep=trained["sweep"], names=["train/loss"])
    assert set(df["run_id"]) == set(trained["members"]) and len(trained["members"]) == 4
    done = subprocess.run([CLI, "--server", server.target, "metrics", "--sweep", trained["sweep"], "--name",
                           "train/loss", "--csv"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == len(df) + 1
