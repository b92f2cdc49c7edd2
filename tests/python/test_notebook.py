"""examples/notebook.py runs top to bottom against the server and draws its figures."""
import os
import subprocess
import sys

from conftest import REPO


def test_notebook_runs_to_the_end(server, tmp_path):
    env = dict(os.environ, CIRCUITLAB_TARGET=server.target, CIRCUITLAB_NOTEBOOK_OUT=str(tmp_path), MPLBACKEND="Agg")
    env.pop("CIRCUITLAB_TOKEN", None)
    env.pop("CIRCUITLAB_CA_CERT", None)
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "notebook.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCEEDED" in out.stdout
    assert "icl_rare   accuracy" in out.stdout
    for png in ("coordinates.png", "phase_diagram.png"):
        assert (tmp_path / png).stat().st_size > 10000, png
    # The ablation's effect: in-context recall falls, in-weights recall holds (the printed lines).
    lines = {l.split()[0]: l for l in out.stdout.splitlines() if " accuracy " in l and "->" in l}
    icl = [float(x) for x in lines["icl_rare"].split("accuracy")[1].split("->")]
    iwl = [float(x) for x in lines["iwl"].split("accuracy")[1].split("->")]
    assert icl[0] > 0.9 and icl[1] < 0.5, lines["icl_rare"]
    assert iwl[1] > 0.9, lines["iwl"]
