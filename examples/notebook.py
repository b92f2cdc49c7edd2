# %% [markdown]
# # circuitlab from Python: an induction head forms, we ablate it, and map a phase diagram
#
# Cells are marked `# %%` (VS Code, Jupyter via jupytext, or run top to bottom:
# `python3 examples/notebook.py`). Needs a running server (scripts/demo.sh starts one, or
# `circuitlab-server --data ./data`) and the package: `pip install --no-build-isolation ./client/python`.
# The server, token and CA come from CIRCUITLAB_TARGET, CIRCUITLAB_TOKEN(_FILE), CIRCUITLAB_CA_CERT.

# %%
import os

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402

import circuitlab  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("CIRCUITLAB_NOTEBOOK_OUT", ".")
c = circuitlab.Client()
print("connected to", c.target, "as", c.whoami().principal)

# %% Train the induction example (2-layer IMIR model, ~8 s on one core) and watch it.
run = c.submit(os.path.join(HERE, "induction.json"))
for event in c.watch(run.run_id):
    if event.HasField("state"):
        print(run.run_id, circuitlab.experiment_service_pb2.RunState.Name(event.state.state))
run = c.get_run(run.run_id)
print({k: round(v, 4) for k, v in sorted(run.progress.latest.items()) if k.endswith("/accuracy")})

# %% Its metrics as a DataFrame (long: run_id, name, step, value).
df = c.metrics_df(run.run_id, ["train/loss", "eval/icl_rare/accuracy", "eval/iwl/accuracy"])
print(df.groupby("name")["value"].last())

# %% The IMIR coordinates over training: alpha (previous-token head), beta (match), gamma (copy), delta (in-weights).
ax = c.plot_coordinates(run.run_id)
ax.figure.savefig(os.path.join(OUT, "coordinates.png"), dpi=100, bbox_inches="tight")
plt.close(ax.figure)
coords = c.coordinates_df(run.run_id)
print(coords.groupby("name")["value"].last().round(3))

# %% Ablate the previous-token head (layer 1, head 1): in-context recall collapses, in-weights recall stays.
ablation = c.intervene({"interventions": [{"op": "OP_ABLATE_HEAD", "layer": 1, "head": 1}],
                        "eval_sets": ["icl_rare", "iwl"]}, run_id=run.run_id)
for e in ablation.effects:
    print(f"{e.eval_set:10s} accuracy {e.accuracy_clean:.3f} -> {e.accuracy:.3f}")

# %% A small phase diagram: 2x2 initial coordinates of the 3-layer model (examples/phase_diagram.json's plane,
# shortened), each member's circuit label and its in-context accuracy.
base = circuitlab.sweep_spec(os.path.join(HERE, "phase_diagram.json"))
base.name = "notebook-phase"
base.base.training.steps = 300
for axis in base.axes:
    del axis.values[:]
    for v in (0.0, 0.5):
        axis.values.add().number_value = v
sweep = c.submit_sweep(base)
for r in sweep.run_ids:
    c.wait(r)
summary = c.sweep_summary_df(sweep.sweep_id, values=["eval/icl_rare/accuracy", "circuit"])
print(summary)
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
c.plot_phase_diagram(sweep.sweep_id, "a", "b", "circuit", ax=left)
c.plot_phase_diagram(sweep.sweep_id, "a", "b", "eval/icl_rare/accuracy", ax=right)
fig.savefig(os.path.join(OUT, "phase_diagram.png"), dpi=100, bbox_inches="tight")
plt.close(fig)
print("wrote", os.path.join(OUT, "coordinates.png"), "and", os.path.join(OUT, "phase_diagram.png"))
