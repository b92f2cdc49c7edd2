#!/usr/bin/python3
"""End-to-end test with an independent gRPC client: Python stubs generated
from the same protos talk to a real circuitlab-server child process.

    python_client_test.py SERVER_BINARY
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
SERVER = sys.argv.pop(1) if len(sys.argv) > 1 else "build/server/circuitlab-server"

TMP = tempfile.mkdtemp(prefix="circuitlab-py-")
os.environ.setdefault("CIRCUITLAB_PB_DIR", os.path.join(TMP, "pb"))
import circuitlab_client as cl  # noqa: E402
import grpc  # noqa: E402

SPEC = """{
  "name": "python-e2e", "seed": 9, "tags": ["py"],
  "task": {"associative_recall": {"num_common": 4, "num_rare": 12, "num_heldout": 4, "num_blocks": 4,
                                  "num_positions": 8}},
  "training": {"learning_rate": 4.0, "batch_size": 32, "steps": 80},
  "recording": {"metrics_every": 10, "eval_every": 40, "eval_size": 64}
}"""

LATENT_SPEC = """{
  "name": "python-dice", "seed": 4,
  "task": {"latent": {"kind": "LATENT_KIND_DICE", "seq_len": 16}},
  "model": {"decoder": {"num_layers": 1, "d_model": 16, "num_heads": 2}},
  "training": {"steps": 30}, "recording": {"eval_size": 32}
}"""


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc = subprocess.Popen([SERVER, "--data", os.path.join(TMP, "data"), "--listen", "127.0.0.1:0"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = cls.proc.stdout.readline()
        assert line.startswith("listening port="), line
        cls.client = cl.Client("127.0.0.1:" + line.strip().split("=")[1], timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        assert cls.proc.wait(timeout=30) == 0
        shutil.rmtree(TMP, ignore_errors=True)

    def test_submit_watch_metrics(self):
        self.assertTrue(self.client.health())
        run = self.client.submit(cl.spec_from_json(SPEC))
        self.assertEqual(run.state, cl.pb.RUN_STATE_QUEUED)
        events = list(self.client.watch(run.run_id, include_metrics=True))
        self.assertTrue(events[0].HasField("snapshot"))
        self.assertEqual(events[-1].state.state, cl.pb.RUN_STATE_SUCCEEDED)
        metrics = self.client.metrics(run.run_id, names=["train/loss", "eval/icl_rare/accuracy"])
        self.assertEqual([s for s, _ in metrics["train/loss"]], list(range(10, 81, 10)))
        self.assertEqual([s for s, _ in metrics["eval/icl_rare/accuracy"]], [0, 40, 80])
        self.assertIn(run.run_id, [r.run_id for r in self.client.list(tags=["py"])])
        # Analyses are jobs: project and intervene wait for theirs; nothing is left queued.
        proj = self.client.project(run.run_id)
        self.assertEqual(proj.state, cl.apb.ANALYSIS_STATE_DONE)
        self.assertGreater(len(proj.coordinates), 0)
        ablate = cl.apb.InterveneRequest(
            run_id=run.run_id, interventions=[cl.apb.Intervention(op=cl.apb.Intervention.OP_ABLATE_HEAD, layer=1)])
        effects = self.client.intervene(ablate).effects
        self.assertGreater(len(effects), 0)
        self.assertEqual(len(self.client.analysis_jobs().jobs), 0)
        with self.assertRaises(grpc.RpcError) as err:
            self.client.cancel_analysis("a999")
        self.assertEqual(err.exception.code(), grpc.StatusCode.NOT_FOUND)
        # An ended run can be deleted, checkpoints and all.
        deleted = self.client.delete_run(run.run_id)
        self.assertGreater(deleted.freed_bytes, 0)
        with self.assertRaises(grpc.RpcError) as err:
            self.client.get(run.run_id)
        self.assertEqual(err.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_task_vectors_of_a_latent_run(self):
        spec = cl.spec_from_json(LATENT_SPEC)
        run = self.client.submit(spec)
        events = list(self.client.watch(run.run_id))
        self.assertEqual(events[-1].state.state, cl.pb.RUN_STATE_SUCCEEDED)
        resp = self.client.task_vectors(run.run_id, analyses=["ood_r2", "p0"], samples_per_cell=16)
        names = {v.name for v in resp.values}
        self.assertIn("ood_r2/code", names)
        self.assertIn("p0/resid_ratio", names)
        self.assertEqual(resp.request.hook, "post_mlp")
        again = self.client.task_vectors(run.run_id, analyses=["ood_r2", "p0"], samples_per_cell=16)
        self.assertTrue(again.from_store)
        with self.assertRaises(grpc.RpcError) as err:
            self.client.task_vectors(run.run_id, analyses=["p9"])
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_errors_are_grpc_statuses(self):
        spec = cl.spec_from_json(SPEC)
        spec.task.associative_recall.num_blocks = 0
        with self.assertRaises(grpc.RpcError) as err:
            self.client.submit(spec)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("task.associative_recall.num_blocks must be in [1, 256], got 0", err.exception.details())
        with self.assertRaises(grpc.RpcError) as err:
            self.client.get("r999")
        self.assertEqual(err.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(Exception):
            cl.spec_from_json('{"no_such_field": 1}')



class SecuredServerTest(unittest.TestCase):
    """TLS and a tokens file: the client reads its CA and token from the environment."""

    def test_tls_and_token_from_the_environment(self):
        scripts = os.path.join(HERE, "..", "..", "scripts")
        tmp = os.path.join(TMP, "secured")
        subprocess.run([os.path.join(scripts, "dev-certs.sh"), os.path.join(tmp, "certs")], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([os.path.join(scripts, "add-principal.sh"), "ada", "reader", os.path.join(tmp, "tokens.txt"),
                        tmp], check=True, stdout=subprocess.DEVNULL)
        proc = subprocess.Popen([SERVER, "--data", os.path.join(tmp, "data"), "--listen", "127.0.0.1:0",
                                 "--tls-cert", os.path.join(tmp, "certs", "server.pem"),
                                 "--tls-key", os.path.join(tmp, "certs", "server.key"),
                                 "--auth-tokens-file", os.path.join(tmp, "tokens.txt")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            target = "127.0.0.1:" + proc.stdout.readline().strip().split("=")[1]
            env = {"CIRCUITLAB_TARGET": target, "CIRCUITLAB_CA_CERT": os.path.join(tmp, "certs", "ca.pem"),
                   "CIRCUITLAB_TOKEN_FILE": os.path.join(tmp, "ada.token")}
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                client = cl.Client(timeout=10)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k)
                    else:
                        os.environ[k] = v
            me = client.whoami()
            self.assertEqual((me.principal, me.role, me.tls), ("ada", "reader", True))
            workers = client.workers()
            self.assertEqual((workers.executor, len(workers.workers)), ("local", 0))
            with self.assertRaises(grpc.RpcError) as denied:
                client.submit(cl.spec_from_json(SPEC))
            self.assertEqual(denied.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
            with self.assertRaises(grpc.RpcError) as plaintext:
                cl.Client(target, timeout=5).list()
            self.assertEqual(plaintext.exception.code(), grpc.StatusCode.UNAVAILABLE)
        finally:
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=30), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
