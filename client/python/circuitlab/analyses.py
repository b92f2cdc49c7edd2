"""The analysis jobs of AnalysisService as Client methods, from the service's descriptor.

An AnalysisService job (its answer carries `state` and `job_id`, its request `force`) without a hand-written
method on Client gets one, named by the fronts' rule (server/common/analysis_names.h: GetLogitLens ->
logit_lens), with its DataFrame form (<name>_df: frames.answer_df). Fields go in as keyword arguments (or
`request`: a message, dict, JSON text or path); the answer is the response message, waited for as every job
is. An analysis added to the proto needs nothing here.
"""
import re

from circuitlab.v1 import analysis_service_pb2 as apb


def front_name(method):
    """The fronts' name of an AnalysisService method, in snake case: GetLogitLens -> logit_lens."""
    name = method[3:] if method.startswith("Get") and method[3:4].isupper() else method
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def is_job(method):
    """An analysis that runs as a job on the server (waited for, stored)."""
    out, req = method.output_type.fields_by_name, method.input_type.fields_by_name
    return "state" in out and "job_id" in out and "force" in req


def _job_method(method, message):
    name = front_name(method.name)
    request_type = getattr(apb, method.input_type.name)

    def call(self, run_id=None, request=None, progress=None, deadline=600.0, poll=0.2, **fields):
        req = message(request_type, request, run_id=run_id, **fields)
        return self._job(getattr(self._analysis, method.name), req, name.replace("_", " "), progress, deadline, poll)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = (f"{method.name} (a job): fields as {method.input_type.name} "
                    f"({', '.join(f.name for f in method.input_type.fields if f.name != 'run_id')}); returns a "
                    f"{method.output_type.name}. {name}_df gives it as a DataFrame. The fields' meaning: the "
                    f"proto's comments (docs/reference/generated/rpc.md).")
    return call


def _job_df(name):
    def df(self, run_id=None, request=None, table=None, **fields):
        from circuitlab import frames
        return frames.answer_df(getattr(self, name)(run_id, request, **fields), table)

    df.__name__ = df.__qualname__ = name + "_df"
    df.__doc__ = (f"{name}(...) as a DataFrame: a row per entry of the answer's first table (or `table`, a "
                  f"repeated message field), led by its echoes of the request (frames.answer_df).")
    return df


def install(cls, message):
    """Adds the missing methods to `cls` (the Client); `message` builds a request (client.message)."""
    for method in apb.DESCRIPTOR.services_by_name["AnalysisService"].methods:
        if not is_job(method):
            continue
        name = front_name(method.name)
        if not hasattr(cls, name):
            setattr(cls, name, _job_method(method, message))
        if not hasattr(cls, name + "_df"):
            setattr(cls, name + "_df", _job_df(name))
