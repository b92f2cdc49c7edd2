"""The Client: every RPC of circuitlab-server as a method.

Requests are built from Pythonic arguments; specs and requests are accepted as
a message, a dict, JSON text or a path to a JSON file. Results are the proto
messages. Analyses that are jobs on the server are waited for (optional
progress callback, tqdm when installed, a deadline). Errors are
circuitlab.errors.CircuitlabError subclasses carrying the gRPC code and the
server's message.
"""
import json
import os
import sys
import time

import grpc
from google.protobuf import json_format

from circuitlab import analyses, errors
from circuitlab._health import health_pb2, health_pb2_grpc
from circuitlab.v1 import analysis_service_pb2 as apb
from circuitlab.v1 import analysis_service_pb2_grpc as apb_grpc
from circuitlab.v1 import experiment_service_pb2 as pb
from circuitlab.v1 import experiment_service_pb2_grpc as pb_grpc
from circuitlab.v1 import reproduce_pb2 as rpb
from circuitlab.v1 import reproduce_pb2_grpc as rpb_grpc
from circuitlab.v1 import spec_pb2
from circuitlab.v1 import worker_service_pb2 as wpb
from circuitlab.v1 import worker_service_pb2_grpc as wpb_grpc

FINAL_STATES = frozenset({pb.RUN_STATE_SUCCEEDED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED})
_PENDING = (apb.ANALYSIS_STATE_QUEUED, apb.ANALYSIS_STATE_RUNNING)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def message(cls, value=None, **fields):
    """A `cls` message from a message, a dict, JSON text or a JSON file path, with `fields` set on top
    (by proto field name; enums by name or number). Unknown fields raise InvalidArgument."""
    if isinstance(value, cls) and not fields:
        return value
    if value is None:
        data = {}
    elif isinstance(value, cls):
        data = json_format.MessageToDict(value, preserving_proto_field_name=True)
    elif isinstance(value, dict):
        data = dict(value)
    elif isinstance(value, (str, os.PathLike)):
        text = str(value)
        if not text.lstrip().startswith("{") and os.path.exists(text):
            text = _read(text).decode()
        try:
            data = json.loads(text)
        except ValueError as e:
            raise errors.InvalidArgument(f"not a {cls.DESCRIPTOR.name} (JSON text or file): {e}") from None
    else:
        raise TypeError(f"a {cls.DESCRIPTOR.name} is a message, dict, JSON text or path, not {type(value).__name__}")
    # A message among the fields (prompts=client.prompts(...)) goes in as its dict.
    data.update({k: json_format.MessageToDict(v, preserving_proto_field_name=True) if hasattr(v, "DESCRIPTOR") else v
                 for k, v in fields.items() if v is not None})
    try:
        return json_format.ParseDict(data, cls())
    except json_format.ParseError as e:
        raise errors.InvalidArgument(f"{cls.DESCRIPTOR.name}: {e}") from None


def spec(value=None, **fields):
    """An ExperimentSpec from a message, dict, JSON text or file path (plus top-level fields)."""
    return message(spec_pb2.ExperimentSpec, value, **fields)


def sweep_spec(value=None, **fields):
    """A SweepSpec (examples/phase_diagram.json) from a message, dict, JSON text or file path."""
    return message(pb.SweepSpec, value, **fields)


class _Progress:
    """Shows a job's progress: a callback, tqdm (when installed and wanted), or nothing."""

    def __init__(self, what, progress):
        self.fn, self.bar = None, None
        if callable(progress):
            self.fn = progress
        elif progress or (progress is None and sys.stderr.isatty()):
            try:
                from tqdm.auto import tqdm  # optional
                self.bar = tqdm(total=100, desc=what, unit="%")
            except ImportError:
                pass

    def __call__(self, fraction, response):
        if self.fn:
            self.fn(fraction, response)
        if self.bar is not None:
            self.bar.update(max(0, round(100 * fraction) - self.bar.n))

    def close(self):
        if self.bar is not None:
            self.bar.close()


# Answers up to 64 MiB (an exported model, activations), as the C++ client accepts.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]


class Client:
    """A connection to a circuitlab-server.

    target: host:port (default $CIRCUITLAB_TARGET, else 127.0.0.1:50051).
    token: bearer token (default $CIRCUITLAB_TOKEN, else the first line of $CIRCUITLAB_TOKEN_FILE).
    ca_cert: PEM file of the CA that signed the server's certificate; set, the channel is TLS
      (default $CIRCUITLAB_CA_CERT). client_cert/client_key: PEM files for mutual TLS.
    timeout: deadline of each call in seconds.
    """

    def __init__(self, target=None, token=None, ca_cert=None, *, timeout=30.0, client_cert=None, client_key=None,
                 tls_server_name=None):
        # An argument wins over the environment; "" means "none" (e.g. ca_cert="": plaintext).
        self.target = target or os.environ.get("CIRCUITLAB_TARGET") or "127.0.0.1:50051"
        if token is None:
            token = os.environ.get("CIRCUITLAB_TOKEN")
        if token is None and os.environ.get("CIRCUITLAB_TOKEN_FILE"):
            lines = _read(os.environ["CIRCUITLAB_TOKEN_FILE"]).decode().splitlines()
            token = lines[0].strip() if lines else None
        if ca_cert is None:
            ca_cert = os.environ.get("CIRCUITLAB_CA_CERT")
        if ca_cert or client_cert:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_cert) if ca_cert else None,
                private_key=_read(client_key) if client_key else None,
                certificate_chain=_read(client_cert) if client_cert else None)
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
            self._channel = grpc.secure_channel(self.target, creds, options=options + _CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        self._runs = pb_grpc.ExperimentServiceStub(self._channel)
        self._analysis = apb_grpc.AnalysisServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._workers = wpb_grpc.WorkerServiceStub(self._channel)
        self._reproductions = rpb_grpc.ReproductionServiceStub(self._channel)
        self.timeout = timeout
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._metadata.append(("x-circuitlab-client", "python"))

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    # ------------------------------------------------------------ the server --

    def health(self, service=""):
        """True when the server serves (grpc.health.v1; no token needed); `service` asks one service by its
        full name ("circuitlab.v1.WorkerService": serving only on a server with remote workers)."""
        resp = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service))
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    def whoami(self):
        """WhoAmIResponse: the principal the server takes this client for, its role and limits."""
        return self._call(self._runs.WhoAmI, pb.WhoAmIRequest())

    def workers(self):
        """ListWorkersResponse: the executor and the remote workers connected now."""
        return self._call(self._workers.ListWorkers, wpb.ListWorkersRequest())

    # ------------------------------------------------------------------ runs --

    def submit(self, experiment, **fields):
        """SubmitRun: queue a run; `experiment` is a spec (message, dict, JSON text or path). Returns the Run."""
        return self._call(self._runs.SubmitRun, pb.SubmitRunRequest(spec=spec(experiment, **fields))).run

    def get_run(self, run_id):
        """GetRun: the Run with its progress and latest metrics."""
        return self._call(self._runs.GetRun, pb.GetRunRequest(run_id=run_id))

    def list_runs(self, states=(), tags=(), sweep=None, mine=False, page_size=200):
        """ListRuns, lazily: yields Runs newest first, fetching pages as it goes.
        states: RunState numbers or names ("running", "RUN_STATE_RUNNING")."""
        req = pb.ListRunsRequest(states=[_state(s) for s in states], tags=list(tags), sweep_id=sweep or "",
                                 mine=mine, page_size=page_size)
        while True:
            page = self._call(self._runs.ListRuns, req)
            yield from page.runs
            if not page.next_page_token:
                return
            req.page_token = page.next_page_token

    def runs(self, states=(), tags=(), sweep=None, mine=False):
        """Every matching Run (list_runs, collected)."""
        return list(self.list_runs(states, tags, sweep, mine))

    def cancel_run(self, run_id):
        """CancelRun: a queued run ends at once, a running one at its next step. Returns the Run."""
        return self._call(self._runs.CancelRun, pb.CancelRunRequest(run_id=run_id))

    def delete_run(self, run_id):
        """DeleteRun: an ended run and everything stored for it."""
        return self._call(self._runs.DeleteRun, pb.DeleteRunRequest(run_id=run_id))

    def watch(self, run_id, include_metrics=False, reconnect_seconds=60.0):
        """WatchRun as a generator of RunEvents, ending after the final state. A dropped stream is
        resumed from the last event seen (as the CLI does), for up to `reconnect_seconds` of trying."""
        after, epoch, lost_since = 0, "", None
        while True:
            req = pb.WatchRunRequest(run_id=run_id, include_metrics=include_metrics, after_sequence=after, epoch=epoch)
            try:
                for event in self._runs.WatchRun(req, metadata=self._metadata):
                    lost_since = None
                    if event.WhichOneof("event") != "heartbeat":
                        after, epoch = event.sequence, event.epoch
                    yield event
                    if event.HasField("state") and event.state.state in FINAL_STATES:
                        return
                    if event.HasField("snapshot") and event.snapshot.state in FINAL_STATES:
                        return
                return  # the server ended the stream: the run had ended
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL):
                    raise errors.from_rpc_error(e) from None
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > reconnect_seconds:
                    raise errors.from_rpc_error(e) from None
                time.sleep(0.5)

    def wait(self, run_id, deadline=None, poll=0.5):
        """Waits until the run ends; returns the Run. Timeout after `deadline` seconds (the run goes on)."""
        start = time.monotonic()
        while True:
            run = self.get_run(run_id)
            if run.state in FINAL_STATES:
                return run
            if deadline is not None and time.monotonic() - start > deadline:
                raise errors.Timeout(f"{run_id} still {pb.RunState.Name(run.state)} after {deadline} s")
            time.sleep(poll)

    def metrics(self, run_id, names=(), min_step=0, max_step=0, max_points=0):
        """GetMetrics: GetMetricsResponse with one MetricSeries (steps, values) per name."""
        req = pb.GetMetricsRequest(run_id=run_id, names=list(names), min_step=min_step, max_step=max_step,
                                   max_points=max_points)
        return self._call(self._runs.GetMetrics, req)

    # ---------------------------------------------------------------- sweeps --

    def submit_sweep(self, sweep, **fields):
        """SubmitSweep: `sweep` a SweepSpec (message, dict, JSON text or path). Returns the Sweep."""
        return self._call(self._runs.SubmitSweep, pb.SubmitSweepRequest(sweep=sweep_spec(sweep, **fields)))

    def get_sweep(self, sweep_id):
        return self._call(self._runs.GetSweep, pb.GetSweepRequest(sweep_id=sweep_id))

    def cancel_sweep(self, sweep_id):
        return self._call(self._runs.CancelSweep, pb.CancelSweepRequest(sweep_id=sweep_id))

    def delete_sweep(self, sweep_id):
        return self._call(self._runs.DeleteSweep, pb.DeleteSweepRequest(sweep_id=sweep_id))

    def sweep_summary(self, sweep_id, values=(), filters=(), pivot=None):
        """GetSweepSummary. pivot: (x, y, value[, aggregate]) or a dict of SweepPivot fields."""
        req = pb.GetSweepSummaryRequest(sweep_id=sweep_id, values=list(values), filters=list(filters))
        if pivot:
            p = dict(zip(("x", "y", "value", "aggregate"), pivot)) if isinstance(pivot, (tuple, list)) else pivot
            req.pivot.CopyFrom(pb.SweepPivot(**p))
        return self._call(self._runs.GetSweepSummary, req)

    # -------------------------------------------------------------- analyses --

    def _job(self, method, request, what, progress, deadline, poll):
        """Asks until the job is DONE (the server holds each call up to ~2 s); AnalysisFailed when it fails."""
        start, shown = time.monotonic(), _Progress(what, progress)
        try:
            while True:
                resp = self._call(method, request)
                if resp.state not in _PENDING:
                    if resp.state != apb.ANALYSIS_STATE_DONE:
                        raise errors.AnalysisFailed(f"{what}: {apb.AnalysisState.Name(resp.state)}: {resp.error}")
                    shown(1.0, resp)
                    return resp
                shown(resp.progress, resp)
                if deadline is not None and time.monotonic() - start > deadline:
                    raise errors.Timeout(f"{what} job {resp.job_id} still {apb.AnalysisState.Name(resp.state)} "
                                         f"after {deadline} s (it goes on; cancel_analysis('{resp.job_id}') stops it)")
                if request.DESCRIPTOR.fields_by_name.get("force") and request.force:
                    request.force = False  # asking again reports on the same job
                time.sleep(poll)
        finally:
            shown.close()

    def project_checkpoint(self, run_id, step=0, progress=None, deadline=600.0, poll=0.2, **fields):
        """ProjectCheckpoint: the checkpoint's IMIR coordinates and rho (a job)."""
        req = message(apb.ProjectCheckpointRequest, run_id=run_id, step=step, **fields)
        return self._job(self._analysis.ProjectCheckpoint, req, "projection", progress, deadline, poll)

    def trajectory(self, run_id, names=(), selection=None, min_step=0, max_step=0, max_points=0):
        """GetTrajectory: coordinate series over training (names: labels or alpha, beta, gamma, delta)."""
        req = message(apb.GetTrajectoryRequest, run_id=run_id, names=list(names), selection=selection,
                      min_step=min_step, max_step=max_step, max_points=max_points)
        return self._call(self._analysis.GetTrajectory, req)

    def check_invariance(self, request=None, progress=None, deadline=600.0, poll=0.2, **fields):
        """CheckInvariance (Theorem 1 numerically; a job). request/fields: CheckInvarianceRequest."""
        req = message(apb.CheckInvarianceRequest, request, **fields)
        return self._job(self._analysis.CheckInvariance, req, "invariance", progress, deadline, poll)

    def detect_circuit(self, run_id, progress=None, deadline=600.0, poll=0.2, **fields):
        """DetectCircuit (a job)."""
        req = message(apb.DetectCircuitRequest, run_id=run_id, **fields)
        return self._job(self._analysis.DetectCircuit, req, "circuit detection", progress, deadline, poll)

    def intervene(self, request=None, run_id=None, progress=None, deadline=600.0, poll=0.2, **fields):
        """Intervene (a job): `request` an InterveneRequest (message, dict, JSON text or a path such as
        examples/intervene_imir_hooks.json), `run_id` and other fields on top."""
        req = message(apb.InterveneRequest, request, run_id=run_id, **fields)
        return self._job(self._analysis.Intervene, req, "intervention", progress, deadline, poll)

    def label_run(self, run_id, progress=None, deadline=600.0, poll=0.2, **fields):
        """LabelRun (a job): ICL vs IWL at every checkpoint, the winning pair, the run's label."""
        req = message(apb.LabelRunRequest, run_id=run_id, **fields)
        return self._job(self._analysis.LabelRun, req, "label", progress, deadline, poll)

    def check_data_dependence(self, request=None, progress=None, deadline=600.0, poll=0.2, **fields):
        """CheckDataDependence (Theorems 2 and 3 numerically; a job)."""
        req = message(apb.CheckDataDependenceRequest, request, **fields)
        return self._job(self._analysis.CheckDataDependence, req, "data dependence", progress, deadline, poll)

    def analyze_task_vectors(self, run_id=None, sweep_id=None, progress=None, deadline=600.0, poll=0.2, **fields):
        """AnalyzeTaskVectors (a job): fields as AnalyzeTaskVectorsRequest (analyses=["ood_r2"], layers=[1], ...)."""
        req = message(apb.AnalyzeTaskVectorsRequest, run_id=run_id, sweep_id=sweep_id, **fields)
        return self._job(self._analysis.AnalyzeTaskVectors, req, "task vectors", progress, deadline, poll)

    def attention_patterns(self, run_id, progress=None, deadline=600.0, poll=0.2, **fields):
        """GetAttentionPatterns (a job): each head's attention on a few evaluation sequences. Fields as
        GetAttentionPatternsRequest (step, eval_set, sequences=1..16, layers=[...], heads=[...], seed)."""
        req = message(apb.GetAttentionPatternsRequest, run_id=run_id, **fields)
        return self._job(self._analysis.GetAttentionPatterns, req, "attention patterns", progress, deadline, poll)

    def export_weights(self, run_id, step=0, progress=None, deadline=600.0, poll=0.2, **fields):
        """ExportWeights (a job): the checkpoint's weights as a safetensors file (response.safetensors) and
        the model's configuration (response.config_json). load_model() makes a torch module of them."""
        req = message(apb.ExportWeightsRequest, run_id=run_id, step=step, **fields)
        return self._job(self._analysis.ExportWeights, req, "export", progress, deadline, poll)

    def load_model(self, run_id, step=0, **kw):
        """The run's model at a stored checkpoint (the newest when step is 0) as a torch.nn.Module whose
        forward pass is the engine's; .run_with_cache(...) gives GetActivations' hook points
        (circuitlab.models; needs PyTorch, Debian's python3-torch)."""
        from circuitlab import models
        return models.load_model(self.export_weights(run_id, step, **kw).safetensors)

    def activations(self, run_id, tokens, hooks=("logits",), positions=None, step=0, progress=None,
                    deadline=600.0, poll=0.2, **fields):
        """GetActivations (a job) on your own sequences: {hook: numpy array, batch first} (shapes as in
        the response's HookActivation). tokens: a list of token-id lists of one length (or one list);
        positions: the IMIR model's position ids, the same shape (decoders: None)."""
        import numpy as np
        tokens = [list(map(int, t)) for t in (tokens if tokens and hasattr(tokens[0], "__len__") else [tokens])]
        if positions is not None:
            positions = [list(map(int, p)) for p in (positions if hasattr(positions[0], "__len__") else [positions])]
        seqs = [apb.InputSequence(tokens=t, positions=positions[i] if positions is not None else [])
                for i, t in enumerate(tokens)]
        req = message(apb.GetActivationsRequest, run_id=run_id, step=step, **fields)
        req.sequences.extend(seqs)
        req.hooks.extend([hooks] if isinstance(hooks, str) else list(hooks))
        resp = self._job(self._analysis.GetActivations, req, "activations", progress, deadline, poll)
        return {a.hook: np.asarray(a.values, dtype=np.float32).reshape(tuple(a.shape)) for a in resp.activations}

    def cancel_analysis(self, job_id):
        """CancelAnalysis: stops a queued or running analysis job."""
        return self._call(self._analysis.CancelAnalysis, apb.CancelAnalysisRequest(job_id=job_id))

    def analysis_jobs(self):
        """ListAnalysisJobs: the jobs queued and running now, and the executor's load."""
        return self._call(self._analysis.ListAnalysisJobs, apb.ListAnalysisJobsRequest())

    # -------------------------------------------------------- reproductions --

    def recipes(self):
        """ListRecipes: the server's recipes (one per claim of SCIENCE.md E, with their scales)."""
        return self._call(self._reproductions.ListRecipes, rpb.ListRecipesRequest())

    def reproduce(self, recipe, scale="ci", seeds=0, wait=True, progress=None, deadline=None, poll=2.0):
        """StartReproduction of `recipe` (an id such as "E.9", or a Recipe as a message, dict, JSON text or
        path) at `scale` ("ci", "cpu" or "paper") with `seeds` (0: the scale's default). With `wait`, follows
        it to the end (progress as for analyses; Timeout after `deadline` seconds, the reproduction goes on)
        and returns the final Reproduction, whose report holds every check per seed."""
        if isinstance(recipe, str) and not recipe.lstrip().startswith("{") and not os.path.exists(recipe):
            req = rpb.StartReproductionRequest(recipe_id=recipe, scale=scale, seeds=seeds)
        else:
            req = rpb.StartReproductionRequest(recipe=message(rpb.Recipe, recipe), scale=scale, seeds=seeds)
        r = self._call(self._reproductions.StartReproduction, req)
        if not wait:
            return r
        start, shown = time.monotonic(), _Progress(f"{r.recipe_id} ({r.reproduction_id})", progress)
        try:
            while r.state in (rpb.REPRODUCTION_STATE_TRAINING, rpb.REPRODUCTION_STATE_ANALYSING):
                shown(r.progress, r)
                if deadline is not None and time.monotonic() - start > deadline:
                    raise errors.Timeout(f"{r.reproduction_id} still {rpb.ReproductionState.Name(r.state)} after "
                                         f"{deadline} s: {r.phase} (it goes on)")
                time.sleep(poll)
                r = self.get_reproduction(r.reproduction_id)
            shown(1.0, r)
        finally:
            shown.close()
        return r

    def get_reproduction(self, reproduction_id):
        return self._call(self._reproductions.GetReproduction,
                          rpb.GetReproductionRequest(reproduction_id=reproduction_id))

    def reproductions(self, mine=False, full=False, limit=None):
        """ListReproductions, newest first, every page (at most `limit`). Summaries (no recipe; of the
        report, its counts) unless `full` (the recipe and report, but the tables: get_reproduction has them)."""
        view = rpb.REPRODUCTION_VIEW_FULL if full else rpb.REPRODUCTION_VIEW_BASIC
        req = rpb.ListReproductionsRequest(mine=mine, view=view)
        out = []
        while limit is None or len(out) < limit:
            page = self._call(self._reproductions.ListReproductions, req)
            out.extend(page.reproductions)
            if not page.next_page_token:
                break
            req.page_token = page.next_page_token
        return out if limit is None else out[:limit]

    def cancel_reproduction(self, reproduction_id):
        return self._call(self._reproductions.CancelReproduction,
                          rpb.CancelReproductionRequest(reproduction_id=reproduction_id))

    # ------------------------------------------------- DataFrames and plots --

    def runs_df(self, state=(), tags=(), sweep=None, mine=False):
        """Runs as a wide DataFrame: run_id, state, name, sweep_id, created, owner, steps,
        config.<dotted spec path>..., metrics.<name> (last values)."""
        from circuitlab import frames
        return frames.runs_df(self, state, tags, sweep, mine)

    def metrics_df(self, runs=(), names=(), max_points=0, sweep=None):
        """Metric series of `runs` (ids or Runs), or of every member of `sweep`, as a long DataFrame:
        run_id, name, step, value."""
        from circuitlab import frames
        if sweep is not None:
            runs = list(runs) + list(self.get_sweep(sweep).run_ids)
        return frames.metrics_df(self, runs, names, max_points)

    def coordinates_df(self, runs, names=("alpha", "beta", "gamma", "delta"), max_points=0):
        """IMIR coordinates over training, long: run_id, name (canonical or label), label, step, value."""
        from circuitlab import frames
        return frames.coordinates_df(self, runs, names, max_points)

    def sweep_summary_df(self, sweep_id, values=(), pivot=None, filters=(), deadline=600.0):
        """A sweep's summary: one row per member (run_id, state, axes..., value columns...), or with
        pivot=(x, y, value[, aggregate]) the pivot table (index y, columns x). Waits (up to `deadline`
        seconds) for label columns (circuit, pair) the server computes on demand."""
        from circuitlab import frames
        return frames.sweep_summary_df(self, sweep_id, values, pivot, filters, deadline)

    def reproduction_df(self, reproduction):
        """A reproduction's report (an id or a Reproduction) as a long DataFrame: one row per check and seed
        (reproduction_id, recipe, scale, check, description, expected, seed, value, against, passed, outcome)."""
        from circuitlab import frames
        return frames.reproduction_df(self, reproduction)

    def reproduction_table_df(self, reproduction, sweep):
        """The data of one recipe sweep of a finished reproduction (the figure's data): one row per run
        (run_id, state, axes including seed, every column the checks read)."""
        from circuitlab import frames
        return frames.reproduction_table_df(self, reproduction, sweep)

    def task_vectors_df(self, run_id=None, sweep_id=None, **fields):
        """AnalyzeTaskVectors as a long DataFrame: run_id, step, name, layer, position, value (+ swept values)."""
        from circuitlab import frames
        return frames.task_vectors_df(self, run_id, sweep_id, **fields)

    def attention_df(self, run_id, **fields):
        """GetAttentionPatterns as a long DataFrame: layer, head, name, sequence, query, key, query_token,
        key_token, weight (keys <= query). df.pivot(index="query", columns="key", values="weight") on one
        (layer, head, sequence) is the heatmap."""
        from circuitlab import frames
        return frames.attention_df(self, run_id, **fields)

    def activations_df(self, run_id, tokens, hooks=("logits",), positions=None, **fields):
        """GetActivations as a long DataFrame: hook, sequence, axis1..axis3, value (see activations())."""
        from circuitlab import frames
        return frames.activations_df(self, run_id, tokens, hooks, positions, **fields)

    @staticmethod
    def prompts(clean, answers, wrong=None, corrupted=None, positions=None, corrupted_positions=None):
        """An InterveneRequest.Prompts of your own sequences, for intervene(prompts=...) and
        patch_df(prompts=...): clean (and, for a patch sweep, corrupted) token-id lists of one length, the
        correct next token `answers` and the competing `wrong` token (one, or one per prompt); the IMIR
        model's position ids in `positions` (corrupted prompts take them too unless given their own)."""
        def seqs(tokens, pos):
            tokens = [list(map(int, t)) for t in (tokens if hasattr(tokens[0], "__len__") else [tokens])]
            if pos is not None:
                pos = [list(map(int, p)) for p in (pos if hasattr(pos[0], "__len__") else [pos])]
                if len(pos) == 1 and len(tokens) > 1:
                    pos = pos * len(tokens)
            return [apb.InputSequence(tokens=t, positions=pos[i] if pos is not None else [])
                    for i, t in enumerate(tokens)]
        ids = lambda v: [] if v is None else [int(v)] if isinstance(v, int) else list(map(int, v))  # noqa: E731
        p = apb.Prompts(answers=ids(answers), wrong=ids(wrong))
        p.clean.extend(seqs(clean, positions))
        if corrupted is not None:
            p.corrupted.extend(seqs(corrupted, corrupted_positions if corrupted_positions is not None else positions))
        return p

    def patch_df(self, run_id, hooks, reference_set="", positions=(), mask=None, head=0, **fields):
        """D.6 patch_effect as a DataFrame: eval_set, hook, position (-1: all at once), the patched run's
        accuracy, loss, logit_diff and their normalised effects (m_patched - m_base) / (m_source - m_base).
        Other InterveneRequest fields (eval_sets, n_eval, ...) as keywords; prompts=client.prompts(...) patches
        your clean prompts into your corrupted ones (one row set, eval_set "prompts"). A heatmap:
        df.pivot(index="hook", columns="position", values="effect_logit_diff")."""
        from circuitlab import frames
        return frames.patch_df(self, run_id, hooks, reference_set, positions, mask, head, **fields)

    def plot_metrics(self, runs, names, ax=None, logy=False, smooth=0.0):
        from circuitlab import plots
        return plots.plot_metrics(self, runs, names, ax=ax, logy=logy, smooth=smooth)

    def plot_coordinates(self, runs, names=("alpha", "beta", "gamma", "delta"), rho=True, ax=None):
        from circuitlab import plots
        return plots.plot_coordinates(self, runs, names, rho=rho, ax=ax)

    def plot_phase_diagram(self, sweep_id, x, y, value, aggregate=None, ax=None):
        from circuitlab import plots
        return plots.plot_phase_diagram(self, sweep_id, x, y, value, aggregate=aggregate, ax=ax)

    def plot_reproduction(self, reproduction, ax=None):
        """A finished reproduction's checks as a figure: each seed's margin to its threshold, passing side right."""
        from circuitlab import plots
        return plots.plot_reproduction(self, reproduction, ax=ax)

    def plot_reproduction_figure(self, reproduction, index=0):
        """The paper's figure the recipe names (its scale's figures[index]: a label map, a curve with its log-log
        fit, series over training, or bars), drawn from the finished reproduction's tables; a Figure."""
        from circuitlab import plots
        return plots.plot_reproduction_figure(self, reproduction, index)


def _state(s):
    if isinstance(s, int):
        return s
    name = s.upper()
    return pb.RunState.Value(name if name.startswith("RUN_STATE_") else "RUN_STATE_" + name)



# Every AnalysisService job without a method above gets one from the descriptor (circuitlab.analyses).
analyses.install(Client, message)
