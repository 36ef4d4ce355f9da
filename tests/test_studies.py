"""The in-context-learning and bias studies as a user schedules them (`mtnlg job run`, papermill parameters): ICL on
HellaSwag (its prompts read the `query` its process_docs builds) and both studies on a TP2 x PP2 checkpoint. Their
default settings (PIQA, one process) run in tests/test_notebooks.py."""
import json, os, subprocess, sys
from pathlib import Path
import pandas as pd
import pytest
from conftest import ROOT, LAUNCHER_VARS

pytestmark = pytest.mark.slow      # each study launches TP2 x PP2 ranks

MTNLG = str(Path(sys.executable).parent / "mtnlg")


def job_run(notebook: str, run_dir: Path, **params) -> Path:
    "Run nbs/`notebook` with `params` through `mtnlg job run`; the executed notebook's folder."
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1"}
    flags = [a for k, v in params.items() for a in ("-p", k, str(v))]
    p = subprocess.run([MTNLG, "job", "run", str(ROOT / "nbs" / notebook), *flags, "--run-dir", str(run_dir),
                        "--quiet"], capture_output=True, text=True, env=env, timeout=1500)
    assert p.returncode == 0, f"{notebook}: {p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return run_dir


def test_icl_on_hellaswag_at_tp2_pp2(tmp_path):
    "Experiment 1 through `mtnlg eval --tp 2 --pp 2`, experiments 2-4 on HellaSwag's processed examples."
    out = tmp_path / "out"
    job_run("16_icl.ipynb", tmp_path / "job", task="hellaswag", tp=2, pp=2, shots="0,1", limit=8, seeds="1,2",
            max_orders=2, out_dir=out)
    shots = pd.read_csv(out / "shots.csv")
    assert shots.shots.tolist() == [0, 1] and (shots.n == 8).all() and (shots.metric == "acc_norm").all()
    for k in (0, 1):                                   # written by the TP2 x PP2 evaluation's ranks
        r = json.loads((out / "eval_seed1" / f"hellaswag_{k}shot.json").read_text())
        assert r["n"] == 8 and r["shots"] == k
    variants = pd.read_csv(out / "choice_order_format.csv")
    assert set(variants.experiment) == {"as is", "which examples", "order", "format"}
    assert (out / "icl.png").stat().st_size > 10_000


def test_bias_at_tp2_pp2_samples_as_one_process(tmp_path):
    "The TP2 x PP2 checkpoint and its one-process HF export draw the same continuations (one stream a request)."
    out = tmp_path / "out"
    job_run("15_bias.ipynb", tmp_path / "job", tp=2, pp=2, samples=2, out_dir=out)
    d = pd.read_csv(out / "continuations.csv", keep_default_na=False)
    model, hf = d[d.model == "model"].reset_index(drop=True), d[d.model == "compare"].reset_index(drop=True)
    assert len(model) == len(hf) > 50 and (model.prompt == hf.prompt).all()
    same = (model.text == hf.text).mean()
    assert same >= 0.9, same                            # float sums differ across layouts: a rare token may too
    assert model.text.nunique() > len(model) // 2      # and the draws are not one repeated stream
    sent = pd.read_csv(out / "sentiment.csv")
    assert set(sent.model) == {"model", "compare"} and ((sent.low <= sent["mean"]) & (sent["mean"] <= sent.high)).all()
