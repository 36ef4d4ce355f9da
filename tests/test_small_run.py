"""The fast tier's one multi-process run (`make test-fast`): `mtnlg train` at TP2 x DP2 on 4 gloo processes, on real
text from the committed fixtures, trains like one process step for step and leaves a complete checkpoint. The 8-process
3D layouts, bf16, resume and kills are in tests/test_train.py (slow tier)."""
import os, subprocess, sys
from pathlib import Path
import pytest
from mtnlg import data as D
from mtnlg import indexed as IX
from mtnlg.train import latest_checkpoint, read_metrics

MTNLG = str(Path(sys.executable).parent / "mtnlg")
FLAGS = ["--preset", "tiny", "--layers", "2", "--global-batch", "8", "--micro-batch", "2", "--steps", "4",
         "--save-interval", "4", "--set", "eval_interval=4", "--set", "eval_batches=1", "--set", "data.split=90,10,0",
         "--precision", "fp32", "--no-progress"]


def train(out, data, *layout):
    e = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([MTNLG, "train", *FLAGS, "--data", data, "--out", str(out), *layout], capture_output=True,
                       text=True, env=e, timeout=600)
    assert p.returncode == 0, f"mtnlg train failed ({p.returncode}):\n{p.stderr[-4000:]}"
    return read_metrics(out)


def test_tp2_dp2_trains_like_one_process(tmp_path, fixture_data):
    src = D.Source("shakespeare", str(fixture_data / "corpus/tinyshakespeare/input.txt"), split="blank")
    IX.tokenize_to_indexed([src], tmp_path / "shakespeare", workers=1, log=None)
    data = str(tmp_path / "shakespeare")
    one, four = train(tmp_path / "one", data), train(tmp_path / "tp2dp2", data, "--tp", "2", "--dp", "2")
    assert [r["step"] for r in four] == [1, 2, 3, 4]
    for k in ("loss", "grad_norm", "tokens"):
        assert [r[k] for r in four] == pytest.approx([r[k] for r in one], rel=2e-4, abs=1e-6), k
    assert four[-1]["loss"] < four[0]["loss"]
    ck = latest_checkpoint(tmp_path / "tp2dp2")
    assert ck.name == "step00000004" and (ck / "COMPLETE").exists() and len(list((ck / "rng").glob("rank*.pt"))) == 4
