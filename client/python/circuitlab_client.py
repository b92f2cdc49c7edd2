"""Python client for circuitlab-server over stubs generated from the same
protos as the server (proto/circuitlab/v1). Needs Debian's python3-grpcio and
python3-protobuf, and protoc + grpc_python_plugin to generate the stubs (done
on first import into client/python/circuitlab_pb/, or CIRCUITLAB_PB_DIR).

    import circuitlab_client as cl
    c = cl.Client("127.0.0.1:50051")
    run = c.submit(cl.spec_from_json(open("examples/induction.json").read()))
    for event in c.watch(run.run_id):
        ...
    c.metrics(run.run_id, names=["train/loss"])   # {name: [(step, value), ...]}
"""
import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTO_ROOT = os.path.join(_HERE, "..", "..", "proto")
_PB_DIR = os.environ.get("CIRCUITLAB_PB_DIR", os.path.join(_HERE, "circuitlab_pb"))
_PROTOS = ["circuitlab/v1/spec.proto", "circuitlab/v1/experiment_service.proto",
           "circuitlab/v1/analysis_service.proto", "circuitlab/v1/worker_service.proto",
           "grpc/health/v1/health.proto"]


def _generate_stubs():
    marker = os.path.join(_PB_DIR, "circuitlab", "v1", "worker_service_pb2_grpc.py")
    sources = [os.path.join(_PROTO_ROOT, p) for p in _PROTOS]
    if os.path.exists(marker) and all(os.path.getmtime(s) <= os.path.getmtime(marker) for s in sources):
        return
    os.makedirs(_PB_DIR, exist_ok=True)
    plugin = ["--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin"]
    subprocess.run(["protoc", f"--python_out={_PB_DIR}", f"--grpc_python_out={_PB_DIR}", f"-I{_PROTO_ROOT}"] +
                   plugin + sources[:-1], check=True)
    # health.proto would generate a top-level "grpc" package that shadows
    # grpcio; generate it as module circuitlab_health instead (the wire name,
    # grpc.health.v1.Health, comes from its package line and is unchanged).
    src = os.path.join(_PB_DIR, "_src", "circuitlab_health")
    os.makedirs(src, exist_ok=True)
    with open(sources[-1]) as f, open(os.path.join(src, "health.proto"), "w") as out:
        out.write(f.read())
    subprocess.run(["protoc", f"--python_out={_PB_DIR}", f"--grpc_python_out={_PB_DIR}",
                    f"-I{os.path.dirname(src)}", os.path.join(src, "health.proto")] + plugin, check=True)


_generate_stubs()
sys.path.insert(0, _PB_DIR)

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from circuitlab.v1 import experiment_service_pb2 as pb  # noqa: E402
from circuitlab.v1 import experiment_service_pb2_grpc as pb_grpc  # noqa: E402
from circuitlab.v1 import spec_pb2  # noqa: E402
from circuitlab.v1 import analysis_service_pb2 as apb  # noqa: E402
from circuitlab.v1 import analysis_service_pb2_grpc as apb_grpc  # noqa: E402
from circuitlab.v1 import worker_service_pb2 as wpb  # noqa: E402
from circuitlab.v1 import worker_service_pb2_grpc as wpb_grpc  # noqa: E402
from circuitlab_health import health_pb2, health_pb2_grpc  # noqa: E402

FINAL_STATES = {pb.RUN_STATE_SUCCEEDED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED}


def spec_from_json(text):
    """An ExperimentSpec from protobuf JSON; unknown fields raise ParseError."""
    return json_format.Parse(text, spec_pb2.ExperimentSpec())


def _read(path):
    with open(path, "rb") as f:
        return f.read()


class Client:
    """A connection to a circuitlab-server.

    server: host:port (default $CIRCUITLAB_TARGET, else 127.0.0.1:50051).
    token: bearer token (default: the first line of $CIRCUITLAB_TOKEN_FILE, or $CIRCUITLAB_TOKEN).
    ca_cert: PEM file of the CA that signed the server's certificate; set, the channel is TLS
      (default $CIRCUITLAB_CA_CERT). client_cert/client_key: PEM files for a server that requires
      mutual TLS. tls_server_name: check the certificate for this name instead of the host.
    """

    def __init__(self, server=None, timeout=30.0, token=None, ca_cert=None, client_cert=None, client_key=None,
                 tls_server_name=None):
        server = server or os.environ.get("CIRCUITLAB_TARGET", "127.0.0.1:50051")
        if token is None and os.environ.get("CIRCUITLAB_TOKEN_FILE"):
            token = _read(os.environ["CIRCUITLAB_TOKEN_FILE"]).decode().splitlines()[0].strip()
        token = token if token is not None else os.environ.get("CIRCUITLAB_TOKEN")
        ca_cert = ca_cert or os.environ.get("CIRCUITLAB_CA_CERT")
        if ca_cert or client_cert:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_cert) if ca_cert else None,
                private_key=_read(client_key) if client_key else None,
                certificate_chain=_read(client_cert) if client_cert else None)
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
            self._channel = grpc.secure_channel(server, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(server)
        self._stub = pb_grpc.ExperimentServiceStub(self._channel)
        self._analysis = apb_grpc.AnalysisServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._workers = wpb_grpc.WorkerServiceStub(self._channel)
        self._timeout = timeout
        self._metadata = [("authorization", f"Bearer {token}")] if token else []

    def health(self):
        resp = self._health.Check(health_pb2.HealthCheckRequest(), timeout=self._timeout)
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    def whoami(self):
        """The principal the server takes this client for (WhoAmIResponse: principal, role, tls, limits)."""
        return self._stub.WhoAmI(pb.WhoAmIRequest(), timeout=self._timeout, metadata=self._metadata)

    def workers(self):
        """The server's executor (local, workers, slurm) and the remote workers connected now
        (ListWorkersResponse: executor, workers[worker_id, host, engine_job, device, slots, run_ids], queued_runs)."""
        return self._workers.ListWorkers(wpb.ListWorkersRequest(), timeout=self._timeout, metadata=self._metadata)

    def submit(self, spec):
        return self._stub.SubmitRun(pb.SubmitRunRequest(spec=spec), timeout=self._timeout,
                                    metadata=self._metadata).run

    def get(self, run_id):
        return self._stub.GetRun(pb.GetRunRequest(run_id=run_id), timeout=self._timeout, metadata=self._metadata)

    def list(self, states=(), tags=(), page_size=0, mine=False):
        """All matching runs, following pagination (mine: only this principal's)."""
        runs, token = [], ""
        while True:
            resp = self._stub.ListRuns(pb.ListRunsRequest(states=states, tags=tags, page_size=page_size,
                                                          page_token=token, mine=mine),
                                       timeout=self._timeout, metadata=self._metadata)
            runs.extend(resp.runs)
            token = resp.next_page_token
            if not token:
                return runs

    def cancel(self, run_id):
        return self._stub.CancelRun(pb.CancelRunRequest(run_id=run_id), timeout=self._timeout,
                                    metadata=self._metadata)

    def delete_run(self, run_id):
        """Deletes an ended run with its checkpoints; returns DeleteRunResponse (freed_bytes)."""
        return self._stub.DeleteRun(pb.DeleteRunRequest(run_id=run_id), timeout=self._timeout,
                                    metadata=self._metadata)

    def delete_sweep(self, sweep_id):
        """Deletes a sweep and its member runs; returns DeleteSweepResponse."""
        return self._stub.DeleteSweep(pb.DeleteSweepRequest(sweep_id=sweep_id), timeout=self._timeout,
                                      metadata=self._metadata)

    def watch(self, run_id, include_metrics=False, after_sequence=0, epoch=""):
        """Yields RunEvents until the run ends."""
        req = pb.WatchRunRequest(run_id=run_id, include_metrics=include_metrics, after_sequence=after_sequence,
                                 epoch=epoch)
        yield from self._stub.WatchRun(req, metadata=self._metadata)

    def metrics(self, run_id, names=(), min_step=0, max_step=0, max_points=0):
        """{series name: [(step, value), ...]}"""
        resp = self._stub.GetMetrics(pb.GetMetricsRequest(run_id=run_id, names=names, min_step=min_step,
                                                          max_step=max_step, max_points=max_points),
                                     timeout=self._timeout, metadata=self._metadata)
        return {s.name: list(zip(s.steps, s.values)) for s in resp.series}

    def _await_job(self, call, req, what, poll, deadline):
        """Asks `call(req)` again until the analysis job is DONE (the server
        holds each call up to ~2 s, so a quick job answers at once). Raises
        RuntimeError when it FAILED or was CANCELLED."""
        import time
        end = time.monotonic() + deadline
        while True:
            resp = call(req, timeout=self._timeout, metadata=self._metadata)
            if resp.state == apb.ANALYSIS_STATE_DONE:
                return resp
            if resp.state in (apb.ANALYSIS_STATE_FAILED, apb.ANALYSIS_STATE_CANCELLED):
                raise RuntimeError("%s %s: %s" % (what, apb.AnalysisState.Name(resp.state), resp.error))
            if time.monotonic() > end:
                raise TimeoutError("%s (job %s) still %s" % (what, resp.job_id, apb.AnalysisState.Name(resp.state)))
            time.sleep(poll)

    def task_vectors(self, run_id="", sweep_id="", poll=0.3, deadline=600.0, **fields):
        """AnalyzeTaskVectors (an analysis job): waits until DONE and returns the response;
        `fields` are AnalyzeTaskVectorsRequest fields (analyses=["ood_r2"], layers=[1], ...).
        Raises RuntimeError when the analysis fails."""
        req = apb.AnalyzeTaskVectorsRequest(run_id=run_id, sweep_id=sweep_id, **fields)
        return self._await_job(self._analysis.AnalyzeTaskVectors, req, "task-vector analysis", poll, deadline)

    def project(self, run_id, step=0, poll=0.3, deadline=600.0, **fields):
        """ProjectCheckpoint (an analysis job): the checkpoint's IMIR coordinates and rho."""
        req = apb.ProjectCheckpointRequest(run_id=run_id, step=step, **fields)
        return self._await_job(self._analysis.ProjectCheckpoint, req, "projection", poll, deadline)

    def intervene(self, request, poll=0.3, deadline=600.0):
        """Intervene (an analysis job) with an InterveneRequest message; waits until DONE."""
        return self._await_job(self._analysis.Intervene, request, "intervention", poll, deadline)

    def analysis_jobs(self):
        """The analysis jobs queued and running now (ListAnalysisJobsResponse)."""
        return self._analysis.ListAnalysisJobs(apb.ListAnalysisJobsRequest(), timeout=self._timeout,
                                               metadata=self._metadata)

    def cancel_analysis(self, job_id):
        """Stops a queued or running analysis job; returns its AnalysisJob."""
        return self._analysis.CancelAnalysis(apb.CancelAnalysisRequest(job_id=job_id), timeout=self._timeout,
                                             metadata=self._metadata).job
