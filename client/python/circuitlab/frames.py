"""DataFrames over the client's calls (pandas, imported when first used)."""
import json
import time

from google.protobuf import json_format


def _pd():
    try:
        import pandas
    except ImportError:
        raise ImportError("DataFrames need pandas (Debian: apt-get install python3-pandas)") from None
    return pandas


def _ids(runs):
    if isinstance(runs, str):
        runs = [runs]
    return [r if isinstance(r, str) else r.run_id for r in runs]


def _flatten(prefix, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, list) else value


def runs_df(client, state=(), tags=(), sweep=None, mine=False):
    pd = _pd()
    from circuitlab.v1 import experiment_service_pb2 as pb
    rows = []
    for listed in client.list_runs(state if not isinstance(state, str) else [state], tags, sweep, mine):
        run = client.get_run(listed.run_id)  # ListRuns leaves the latest metrics out
        row = {"run_id": run.run_id, "state": pb.RunState.Name(run.state)[len("RUN_STATE_"):].lower(),
               "name": run.name, "sweep_id": run.sweep_id,
               "created": pd.Timestamp(run.created_at.ToDatetime(), tz="UTC") if run.HasField("created_at") else None,
               "owner": run.owner, "device": run.device, "packed_with": ",".join(run.packed_with),
               "step": run.progress.step, "total_steps": run.progress.total_steps}
        config = {}
        _flatten("", json_format.MessageToDict(run.spec, preserving_proto_field_name=True), config)
        row.update({f"config.{k}": v for k, v in config.items()})
        row.update({f"metrics.{k}": v for k, v in sorted(run.progress.latest.items())})
        rows.append(row)
    df = pd.DataFrame(rows, columns=None if rows else ["run_id", "state", "name", "sweep_id", "created", "owner",
                                                       "device", "packed_with", "step", "total_steps"])
    for c in ("step", "total_steps"):
        df[c] = df[c].astype("int64")
    return df


def metrics_df(client, runs, names=(), max_points=0):
    pd = _pd()
    parts = []
    for run_id in _ids(runs):
        for s in client.metrics(run_id, names, max_points=max_points).series:
            parts.append(pd.DataFrame({"run_id": run_id, "name": s.name, "step": list(s.steps), "value": list(s.values)}))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["run_id", "name", "step", "value"])
    return df.astype({"run_id": "string", "name": "string", "step": "int64", "value": "float64"})


def coordinates_df(client, runs, names=("alpha", "beta", "gamma", "delta"), max_points=0):
    pd = _pd()
    parts = []
    for run_id in _ids(runs):
        for s in client.trajectory(run_id, names, max_points=max_points).series:
            c = s.coordinate
            parts.append(pd.DataFrame({"run_id": run_id, "name": c.canonical or c.label, "label": c.label,
                                       "step": list(s.steps), "value": list(s.values)}))
    cols = ["run_id", "name", "label", "step", "value"]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
    return df.astype({"run_id": "string", "name": "string", "label": "string", "step": "int64", "value": "float64"})


def _value(v):
    kind = v.WhichOneof("kind")
    return None if kind in (None, "null_value") else json_format.MessageToDict(v)


def sweep_summary_df(client, sweep_id, values=(), pivot=None, filters=(), deadline=600.0):
    pd = _pd()
    # Label columns (circuit, pair) are computed on demand: ask again until none is pending.
    start = time.monotonic()
    s = client.sweep_summary(sweep_id, values, filters, pivot)
    while s.pending and time.monotonic() - start < deadline:
        time.sleep(1.0)
        s = client.sweep_summary(sweep_id, values, filters, pivot)
    if pivot:
        p = s.pivot
        xs, ys = [_value(v) for v in p.x_values], [_value(v) for v in p.y_values]
        cells = [_value(v) for v in p.cells]
        grid = [cells[j * len(xs):(j + 1) * len(xs)] for j in range(len(ys))]
        df = pd.DataFrame(grid, index=pd.Index(ys, name=p.y), columns=pd.Index(xs, name=p.x))
        df.attrs["value"] = p.value
        return df
    from circuitlab.v1 import experiment_service_pb2 as pb
    rows = []
    for r in s.rows:
        row = {"run_id": r.run_id, "state": pb.RunState.Name(r.state)[len("RUN_STATE_"):].lower()}
        row.update({a: _value(v) for a, v in zip(s.axes, r.swept)})
        row.update({c: _value(v) for c, v in zip(s.columns, r.values)})
        rows.append(row)
    df = pd.DataFrame(rows, columns=["run_id", "state"] + list(s.axes) + list(s.columns))
    return df.convert_dtypes()


def task_vectors_df(client, run_id=None, sweep_id=None, **fields):
    pd = _pd()
    resp = client.analyze_task_vectors(run_id=run_id, sweep_id=sweep_id, **fields)
    rows = []
    for v in resp.values:
        row = {"run_id": v.run_id, "step": v.step, "name": v.name, "layer": v.layer, "position": v.position,
               "value": v.value}
        if v.sweep_values:
            row.update(json.loads(v.sweep_values))
        rows.append(row)
    df = pd.DataFrame(rows, columns=None if rows else ["run_id", "step", "name", "layer", "position", "value"])
    return df.astype({"step": "int64", "layer": "int64", "position": "int64", "value": "float64"})


_ATTENTION_COLUMNS = ["layer", "head", "name", "sequence", "query", "key", "query_token", "key_token", "weight"]


def attention_df(client, run_id, **fields):
    pd = _pd()
    resp = client.attention_patterns(run_id, **fields)
    rows = []
    for p in resp.patterns:
        tokens = resp.sequences[p.sequence].tokens
        for q in range(p.size):
            for k in range(q + 1):
                rows.append((p.layer, p.head, p.name, p.sequence, q, k, tokens[q], tokens[k], p.weights[q * p.size + k]))
    df = pd.DataFrame(rows, columns=_ATTENTION_COLUMNS)
    df.attrs.update(run_id=resp.run_id, step=resp.step, eval_set=resp.eval_set)
    return df


def activations_df(client, run_id, tokens, hooks=("logits",), positions=None, **fields):
    """GetActivations as a long DataFrame: hook, sequence, axis1, axis2, axis3 (the axes after the
    sequence; -1 where a hook has fewer), value. df.attrs: run_id, step, shapes {hook: shape}."""
    import numpy as np
    pd = _pd()
    arrays = client.activations(run_id, tokens, hooks, positions, **fields)
    parts = []
    for hook, a in arrays.items():
        idx = np.indices(a.shape).reshape(a.ndim, -1)
        cols = {"hook": hook, "sequence": idx[0]}
        for i in range(1, 4):
            cols[f"axis{i}"] = idx[i] if i < a.ndim else -1
        cols["value"] = a.reshape(-1)
        parts.append(pd.DataFrame(cols))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["hook", "sequence", "axis1", "axis2", "axis3", "value"])
    df.attrs.update(run_id=run_id, shapes={h: tuple(a.shape) for h, a in arrays.items()})
    return df


_PATCH_COLUMNS = ["eval_set", "hook", "position", "accuracy", "loss", "logit_diff", "effect_accuracy", "effect_loss",
                  "effect_logit_diff"]


def patch_df(client, run_id, hooks, reference_set="", positions=(), mask=None, head=0, **fields):
    """D.6 patch_effect: Intervene with a patch sweep, one row per (eval_set, hook, position); position -1 is
    every swept position at once. Base and source metrics are in df.attrs["base"] / df.attrs["source"]."""
    pd = _pd()
    sweep = {"hooks": list(hooks), "positions": list(positions), "head": head, "reference_set": reference_set}
    if mask is not None:
        sweep["mask"] = mask
    resp = client.intervene(run_id=run_id, patch=sweep, **fields)
    rows, base, source = [], {}, {}
    for e in resp.effects:
        base[e.eval_set] = {"accuracy": e.accuracy_clean, "loss": e.loss_clean, "logit_diff": e.logit_diff_clean}
        source[e.eval_set] = {"accuracy": e.patch_source_accuracy, "loss": e.patch_source_loss,
                              "logit_diff": e.patch_source_logit_diff}
        for p in e.patch:
            rows.append({"eval_set": e.eval_set, "hook": p.hook, "position": p.position, "accuracy": p.accuracy,
                         "loss": p.loss, "logit_diff": p.logit_diff, "effect_accuracy": p.effect_accuracy,
                         "effect_loss": p.effect_loss, "effect_logit_diff": p.effect_logit_diff})
    df = pd.DataFrame(rows, columns=_PATCH_COLUMNS).astype({"position": "int64"})
    df.attrs["base"], df.attrs["source"] = base, source
    return df



def _reproduction(client, reproduction):
    return client.get_reproduction(reproduction) if isinstance(reproduction, str) else reproduction


def reproduction_df(client, reproduction):
    from circuitlab.v1 import reproduce_pb2 as rpb
    pd = _pd()
    r = _reproduction(client, reproduction)
    rows = []
    for c in r.report.checks:
        for k, v in enumerate(c.values):
            rows.append({"reproduction_id": r.reproduction_id, "recipe": r.recipe_id, "scale": r.scale, "check": c.id,
                         "description": c.description, "expected": c.expected, "seed": k + 1, "value": _value(v),
                         "against": _value(c.against[k]) if k < len(c.against) else None,
                         "passed": bool(c.passed[k]) if k < len(c.passed) else False,
                         "outcome": rpb.CheckOutcome.Name(c.outcome).replace("CHECK_OUTCOME_", "")})
    return pd.DataFrame(rows, columns=["reproduction_id", "recipe", "scale", "check", "description", "expected",
                                       "seed", "value", "against", "passed", "outcome"])


def reproduction_table_df(client, reproduction, sweep):
    pd = _pd()
    r = _reproduction(client, reproduction)
    if sweep not in r.report.tables:
        raise KeyError(f"{r.reproduction_id} has no table {sweep!r} (it has {sorted(r.report.tables)})")
    t = r.report.tables[sweep]
    axes = list(t.axes)
    # A column named like an axis (servers before 2026-12-07 added E.5's slope axis as an empty column): the
    # axis wins.
    columns = [(i, c) for i, c in enumerate(t.columns) if c not in axes]
    rows = []
    for row in t.rows:
        out = {"run_id": row.run_id, "state": row.state}
        out.update({a: _value(v) for a, v in zip(axes, row.swept)})
        out.update({c: _value(row.values[i]) for i, c in columns if i < len(row.values)})
        rows.append(out)
    return pd.DataFrame(rows, columns=["run_id", "state"] + axes + [c for _, c in columns])


_JOB_FIELDS = frozenset({"state", "progress", "error", "job_id", "from_store"})


def _field_value(msg, f):
    """One field as a cell: enums by name, repeated scalars as lists, messages as dicts."""
    value = getattr(msg, f.name)
    if f.type == f.TYPE_MESSAGE:
        if f.label == f.LABEL_REPEATED:
            return [json_format.MessageToDict(v, preserving_proto_field_name=True) for v in value]
        return json_format.MessageToDict(value, preserving_proto_field_name=True)
    if f.type == f.TYPE_ENUM:
        names = f.enum_type.values_by_number
        return [names[v].name for v in value] if f.label == f.LABEL_REPEATED else names[value].name
    return list(value) if f.label == f.LABEL_REPEATED else value


def answer_df(answer, table=None):
    """Any analysis answer as a DataFrame, from its descriptor: one row per entry of its first repeated message
    field with entries (or of `table`), a column per field of the entry, led by the answer's echoes of the request
    (run_id, step, eval_set, ...). What every generic analysis method's _df form returns."""
    pd = _pd()
    fields = answer.DESCRIPTOR.fields
    tables = [f for f in fields if f.type == f.TYPE_MESSAGE and f.label == f.LABEL_REPEATED]
    if table is None:
        chosen = next((f for f in tables if len(getattr(answer, f.name))), tables[0] if tables else None)
    else:
        chosen = answer.DESCRIPTOR.fields_by_name.get(table)
        if chosen not in tables:
            raise ValueError(f"{answer.DESCRIPTOR.name} has no table {table!r}; its tables: "
                             f"{', '.join(f.name for f in tables) or 'none'}")
    if chosen is None:
        raise ValueError(f"{answer.DESCRIPTOR.name} has no table (repeated message field); use the message itself")
    echoes = {f.name: _field_value(answer, f) for f in fields
              if f.name not in _JOB_FIELDS and f.type != f.TYPE_MESSAGE and f.label != f.LABEL_REPEATED}
    columns = list(echoes) + [f.name for f in chosen.message_type.fields]
    rows = [{**echoes, **{f.name: _field_value(item, f) for f in chosen.message_type.fields}}
            for item in getattr(answer, chosen.name)]
    return pd.DataFrame(rows, columns=columns)
