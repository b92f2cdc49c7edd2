"""Interventions on the researcher's own prompts (issue 46, item 3): a clean/corrupted patching sweep
written here reproduces the demo's induction-head result -- patching the layer-2 head's output at the
query restores the clean logit difference, the layer-1 head's there does nothing -- on the README's demo
run; a head ablation and a decoder run's patch on prompts; the prompts' bounds answer INVALID_ARGUMENT
naming the field."""
import json
import os
import subprocess

import pytest

import circuitlab
from circuitlab.v1 import experiment_service_pb2 as pb
from conftest import REPO
from test_models import CLI, decoder_run  # noqa: F401 (a fixture)

# The associative-recall format of examples/induction.json (SCIENCE.md A.1): BOS, blocks (key, value)
# on consecutive position ids, the query key last. Clean: the query is 14, whose value in context is 30;
# corrupted: the query is 22 (value 25). The logit difference is logit(30) - logit(25).
CLEAN = [[0, 14, 30, 22, 25, 14], [0, 14, 30, 22, 25, 22]]
CORRUPTED = [[0, 14, 30, 22, 25, 22], [0, 14, 30, 22, 25, 14]]
POSITIONS = [0, 3, 4, 9, 10, 12]
ANSWERS, WRONG = [30, 25], [25, 30]


@pytest.fixture(scope="module")
def demo(client):
    with open(os.path.join(REPO, "examples", "induction.json")) as f:
        spec = json.load(f)
    run = client.submit(spec)
    assert client.wait(run.run_id, deadline=300).state == pb.RUN_STATE_SUCCEEDED
    return run.run_id


def test_patching_the_induction_heads_output_restores_the_logit_difference(client, demo):
    prompts = client.prompts(CLEAN, ANSWERS, wrong=WRONG, corrupted=CORRUPTED, positions=POSITIONS)
    df = client.patch_df(demo, ["L1.H1.out", "L2.H1.out"], prompts=prompts)
    assert set(df["eval_set"]) == {"prompts"} and len(df) == 2 * (6 + 1)
    base, source = df.attrs["base"]["prompts"], df.attrs["source"]["prompts"]
    # The trained model answers the clean prompts and the corrupted ones each with their own value.
    assert source["accuracy"] == 1.0 and source["logit_diff"] > 5
    assert base["logit_diff"] < -5
    effect = df.set_index(["hook", "position"])["effect_logit_diff"]
    assert effect[("L2.H1.out", 5)] > 0.9  # the induction head at the query carries the answer
    assert effect[("L1.H1.out", 5)] < 0.1  # the previous-token head's output at the query does not
    for t in range(5):  # nothing before the query is read differently
        assert abs(effect[("L2.H1.out", t)]) < 0.05, t
    heat = df.pivot(index="hook", columns="position", values="effect_logit_diff")
    assert heat.shape == (2, 7)


def test_a_corrupted_context_key_traces_the_whole_circuit(client, demo):
    # The first block's key 14 replaced by 9: the query 14 finds no match. Restoring the key's embedding
    # (position 1), the previous-token head's output at its value (position 2, "my previous token is
    # 14") or the induction head's at the query (5) each restores the answer; measured 1.000, 1.010 and
    # 1.000, every other site of the two heads |effect| <= 0.17 (L1 at 3) and 0 for L2.
    prompts = client.prompts(CLEAN[:1], 30, wrong=25, corrupted=[[0, 9, 30, 22, 25, 14]], positions=POSITIONS)
    df = client.patch_df(demo, ["embed", "L1.H1.out", "L2.H1.out"], prompts=prompts)
    effect = df.set_index(["hook", "position"])["effect_logit_diff"]
    for hook, t in [("embed", 1), ("L1.H1.out", 2), ("L2.H1.out", 5)]:
        assert effect[(hook, t)] > 0.9, (hook, t)
    for t in [0, 1, 3, 4, 5]:
        assert abs(effect[("L1.H1.out", t)]) < 0.3, t
    for t in range(5):
        assert abs(effect[("L2.H1.out", t)]) < 0.05, t


def test_ablating_the_induction_head_on_the_clean_prompts(client, demo):
    prompts = client.prompts(CLEAN, ANSWERS, wrong=WRONG, positions=POSITIONS)
    resp = client.intervene(run_id=demo, prompts=prompts, interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}])
    (e,) = resp.effects
    assert e.eval_set == "prompts" and e.alt_name == "wrong"
    assert e.accuracy_clean == 1.0 and e.logit_diff_clean > 5
    assert e.logit_diff < e.logit_diff_clean - 5


def test_the_cli_patches_prompts(client, demo, server):
    args = [CLI, "--server", server.target, "intervene", demo, "--patch", "L2.H1.out", "--positions", "5"]
    for c in CLEAN:
        args += ["--clean", ",".join(map(str, c)), "--clean-positions", ",".join(map(str, POSITIONS))]
    for c in CORRUPTED:
        args += ["--corrupted", ",".join(map(str, c))]
    args += ["--answer", "30,25", "--wrong", "25,30", "--csv"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split(",") for line in done.stdout.splitlines()]
    effect = [float(r[5]) for r in rows if r[:5] == ["prompts", "patch", "L2.H1.out", "5", "effect_logit_diff"]]
    assert len(effect) == 1 and effect[0] > 0.9


def test_a_decoder_run_patches_prompts(client, decoder_run):  # noqa: F811
    tokens = [[1, 2, 3, 4, 5, 0, 1, 2], [3, 3, 4, 4, 5, 5, 0, 0]]  # dice faces (vocabulary 6)
    corrupted = [[1, 2, 3, 4, 5, 0, 1, 5], [3, 3, 4, 4, 5, 5, 0, 1]]
    prompts = client.prompts(tokens, [3, 1], wrong=[0, 2], corrupted=corrupted)
    df = client.patch_df(decoder_run, ["L1.resid_pre", "L1.post_mlp"], prompts=prompts)
    effect = df.set_index(["hook", "position"])["effect_logit_diff"]
    # Patching the whole last position's residual stream before the layer restores everything (the
    # earlier positions are the same in both), and nothing earlier matters. The effect is a ratio of
    # float32 logit differences: 1.3e-6 from 1 was seen on one machine, so the bound is 1e-4.
    assert effect[("L1.resid_pre", 7)] == pytest.approx(1.0, abs=1e-4)
    assert effect[("L1.post_mlp", 7)] == pytest.approx(1.0, abs=1e-4)
    for t in range(6):
        assert effect[("L1.resid_pre", t)] == pytest.approx(0.0, abs=1e-4), t


def test_prompt_bounds_name_the_field(client, demo, decoder_run):  # noqa: F811
    p = client.prompts(CLEAN, ANSWERS, positions=POSITIONS)
    cases = [
        (dict(prompts=p, patch={"hooks": ["L1.H1.out"]}), r"prompts\.corrupted: a patch sweep"),
        (dict(prompts=client.prompts(CLEAN, ANSWERS, corrupted=CORRUPTED[:1], positions=POSITIONS),
              patch={"hooks": ["L1.H1.out"]}), r"prompts\.corrupted must pair one to one"),
        (dict(prompts=client.prompts(CLEAN, [30, 25, 1], positions=POSITIONS), patch=None,
              interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}]), r"prompts\.answers must hold one token id"),
        (dict(prompts=client.prompts(CLEAN, [30, 999], positions=POSITIONS),
              interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}]), r"prompts\.answers\[1\] must be in \[0, "),
        (dict(prompts=client.prompts(CLEAN, ANSWERS), interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}]),
         r"prompts\.clean\[0\]\.positions must have one position id per token"),
        (dict(prompts=p, n_eval=64, interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}]), "n_eval must be 0"),
        (dict(prompts=p, eval_sets=["icl_rare"], interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}]),
         "eval_sets must be empty with prompts"),
        (dict(prompts=client.prompts([[1] * 4] * 65, 1, positions=[0, 1, 2, 3]),
              interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}]), r"prompts\.clean must have 1 to 64"),
        (dict(prompts=p, logit_diff_tokens=[30, 25], interventions=[{"op": "OP_ABLATE_HEAD", "layer": 2}]),
         "logit_diff_tokens must be empty with prompts"),
    ]
    for fields, match in cases:
        fields = {k: v for k, v in fields.items() if v is not None}
        with pytest.raises(circuitlab.InvalidArgument, match=match):
            client.intervene(run_id=demo, **fields)
    with pytest.raises(circuitlab.InvalidArgument, match="context length"):
        client.intervene(run_id=decoder_run, prompts=client.prompts([[1] * 17], 1),
                         interventions=[{"op": "OP_ZERO", "hook": "L1.post_mlp"}])
    with pytest.raises(circuitlab.InvalidArgument, match="OP_REPLACE_CONVEX"):
        client.intervene(run_id=decoder_run, prompts=client.prompts([[1, 2]], 1),
                         interventions=[{"op": "OP_REPLACE_CONVEX", "hook": "L1.post_mlp"}])
