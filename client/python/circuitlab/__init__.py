"""circuitlab: the Python client of circuitlab-server.

    import circuitlab
    c = circuitlab.Client()                      # $CIRCUITLAB_TARGET, $CIRCUITLAB_TOKEN(_FILE), $CIRCUITLAB_CA_CERT
    run = c.submit("examples/induction.json")    # a path, JSON text, a dict or an ExperimentSpec
    for event in c.watch(run.run_id): ...
    c.wait(run.run_id)
    df = c.metrics_df([run.run_id], ["train/loss"])
    ax = c.plot_coordinates([run.run_id])
    model = c.load_model(run.run_id)             # a torch.nn.Module (needs python3-torch)

Every RPC of ExperimentService, AnalysisService, ReproductionService and WorkerService.ListWorkers
is a method (see Client); results are the proto messages
(circuitlab.v1.*_pb2); errors are CircuitlabError subclasses.
"""
from circuitlab.client import Client, spec, sweep_spec, FINAL_STATES
from circuitlab.errors import (CircuitlabError, InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
                               Unauthenticated, ResourceExhausted, FailedPrecondition, OutOfRange, Unavailable,
                               DeadlineExceeded, Cancelled, Internal, AnalysisFailed, Timeout)
from circuitlab.models import load_model, read_safetensors
from circuitlab.v1 import spec_pb2, experiment_service_pb2, analysis_service_pb2, worker_service_pb2, reproduce_pb2


def _print_as_utf8(modules):
    """print(message) of every circuitlab message shows its text as UTF-8 ("β L2H1"), not protobuf's
    default octal escapes ("\\316\\262 L2H1")."""
    from google.protobuf import text_format

    def text(self):
        return text_format.MessageToString(self, as_utf8=True)

    def classes(descriptors, scope):
        for d in descriptors:
            cls = getattr(scope, d.name)
            yield cls
            yield from classes(d.nested_types, cls)

    for m in modules:
        for cls in classes(m.DESCRIPTOR.message_types_by_name.values(), m):
            cls.__str__ = text


_print_as_utf8([spec_pb2, experiment_service_pb2, analysis_service_pb2, worker_service_pb2, reproduce_pb2])

__version__ = "0.1.0"
__all__ = ["Client", "load_model", "read_safetensors", "spec", "sweep_spec", "FINAL_STATES", "CircuitlabError", "InvalidArgument", "NotFound",
           "AlreadyExists", "PermissionDenied", "Unauthenticated", "ResourceExhausted", "FailedPrecondition",
           "OutOfRange", "Unavailable", "DeadlineExceeded", "Cancelled", "Internal", "AnalysisFailed", "Timeout",
           "spec_pb2", "experiment_service_pb2", "analysis_service_pb2", "worker_service_pb2", "reproduce_pb2"]
