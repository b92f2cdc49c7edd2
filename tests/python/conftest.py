"""The python tier's fixtures: a real circuitlab-server child process (the
binary in $CIRCUITLAB_SERVER_BIN) and the installed `circuitlab` package (run
by tests/python/python_test.sh from a venv it installed the package into)."""
import os
import signal
import subprocess
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER = os.environ.get("CIRCUITLAB_SERVER_BIN", os.path.join(REPO, "build", "server", "circuitlab-server"))

TINY = {
    "name": "py-tiny", "seed": 9, "tags": ["py"],
    "task": {"associative_recall": {"num_common": 4, "num_rare": 12, "num_heldout": 4, "num_blocks": 4,
                                    "num_positions": 8}},
    "training": {"learning_rate": 4.0, "batch_size": 32, "steps": 80},
    "recording": {"metrics_every": 10, "eval_every": 40, "eval_size": 64, "checkpoint_every": 40,
                  "coordinates_every": 10},
}


class ServerProcess:
    def __init__(self, data, *args):
        self.proc = subprocess.Popen([SERVER, "--data", data, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening port="), line
        self.target = "127.0.0.1:" + line.strip().split("=")[1]
        line = self.proc.stdout.readline()  # "http port=N url=..."
        assert line.startswith("http port="), line
        self.http = "http://127.0.0.1:" + line.split()[1].split("=")[1]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0


@pytest.fixture(scope="session")
def server():
    with tempfile.TemporaryDirectory(prefix="circuitlab-py-") as tmp:
        s = ServerProcess(os.path.join(tmp, "data"), "--cpu-slots", "2")
        yield s
        s.stop()


@pytest.fixture(scope="session")
def client(server):
    import circuitlab
    with circuitlab.Client(server.target, timeout=20) as c:
        yield c


@pytest.fixture(scope="session")
def trained(client):
    """Two finished tiny runs (seeds 9 and 10) and a finished 2x2 sweep (lr x seed)."""
    runs = [client.submit(TINY), client.submit(TINY, seed=10, name="py-tiny-b")]
    sweep = client.submit_sweep({"name": "py-sweep", "base": dict(TINY, training=dict(TINY["training"], steps=40)),
                                 "axes": [{"field": "training.learning_rate", "name": "lr", "values": [1, 4]},
                                          {"field": "seed", "values": [1, 2]}]})
    for r in [*(r.run_id for r in runs), *sweep.run_ids]:
        assert client.wait(r, deadline=120).state == 3, r  # RUN_STATE_SUCCEEDED
    return {"runs": [r.run_id for r in runs], "sweep": sweep.sweep_id, "members": list(sweep.run_ids)}
