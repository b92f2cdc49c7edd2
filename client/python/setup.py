"""Builds the circuitlab package. The gRPC stubs are generated here, at build
time, by stubs.py (Debian's protoc and grpc_python_plugin, from the
repository's proto/) into the package; never at import. `cmake --install`
installs the same package beside the binaries without pip.

    pip install --no-build-isolation ./client/python      # in a venv made with --system-site-packages
"""
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import stubs  # noqa: E402

PROTO_ROOT = os.environ.get("CIRCUITLAB_PROTO_DIR", stubs.DEFAULT_PROTO_ROOT)
if os.path.isdir(os.path.join(PROTO_ROOT, "circuitlab")):
    stubs.generate(HERE, os.path.abspath(PROTO_ROOT))
elif not os.path.exists(os.path.join(HERE, "circuitlab", "v1", "spec_pb2.py")):
    raise SystemExit(f"circuitlab: no protos under {PROTO_ROOT} (set CIRCUITLAB_PROTO_DIR)")
setup()
