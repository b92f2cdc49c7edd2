"""One exception hierarchy for everything the server refuses or fails.

Each carries the gRPC status `code` (a grpc.StatusCode) and the server's
`message`. Catch CircuitlabError for all of them, or a subclass:

    try:
        c.get_run("r99")
    except circuitlab.NotFound as e:
        print(e.code, e.message)
"""
import grpc


class CircuitlabError(Exception):
    """A call the server refused or could not complete."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return f"{self.code.name}: {self.message}"


class InvalidArgument(CircuitlabError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CircuitlabError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(CircuitlabError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(CircuitlabError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(CircuitlabError):
    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(CircuitlabError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(CircuitlabError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRange(CircuitlabError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unavailable(CircuitlabError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(CircuitlabError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(CircuitlabError):
    code = grpc.StatusCode.CANCELLED


class Internal(CircuitlabError):
    code = grpc.StatusCode.INTERNAL


class AnalysisFailed(CircuitlabError):
    """An analysis job ended FAILED or CANCELLED (its `error` is the message)."""


class Timeout(CircuitlabError):
    """A wait (an analysis job, a run) passed its deadline; the work goes on on the server."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, AlreadyExists, PermissionDenied, Unauthenticated,
                                      ResourceExhausted, FailedPrecondition, OutOfRange, Unavailable,
                                      DeadlineExceeded, Cancelled, Internal)}


def from_rpc_error(err):
    """The CircuitlabError for a grpc.RpcError."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") and err.details() else str(err)
    return _BY_CODE.get(code, CircuitlabError)(message, code)
