"""The long-lived gloo groups connect lazily: a world-sized group made eagerly holds world - 1 sockets a rank (2,239 at
530B), one made by `mtnlg.topology.lazy_gloo_group` only those its collectives use. One 8-rank gloo launch."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from conftest import free_port

WORLD = 8

@pytest.mark.slow
def test_lazy_group_holds_no_full_mesh_and_the_eager_control_does(tmp_path):
    worker = Path(__file__).parent / "gloo_groups_worker.py"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--nproc-per-node", str(WORLD), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(worker), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, c in enumerate(ranks):
        assert c["eager_made"] >= WORLD - 1, (r, c)           # control: the count sees a full mesh where there is one
        assert c["lazy_made"] <= 1, (r, c)                     # made: no pair connected (at most the store's client)
        assert c["lazy_used"] < WORLD - 1, (r, c)              # used: only the peers a broadcast and a gather need
        assert c["lazy_env_after"] is None, (r, c)             # the switch applied to that one group only
