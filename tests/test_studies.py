"""The in-context-learning and bias studies as a user schedules them (`mtnlg job run`, papermill parameters): ICL on
every paper task (one process), on HellaSwag (its prompts read the `query` its process_docs builds) and both studies
on a TP2 x PP2 checkpoint. Their default settings (PIQA, one process) run in tests/test_notebooks.py."""
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


@pytest.mark.parametrize("task,metric", [("hellaswag", "acc_norm"), ("race_h", "acc_mutual_info")])
def test_icl_at_tp2_pp2(tmp_path, task, metric):
    "Experiment 1 through one `mtnlg eval --tp 2 --pp 2` for all its shot counts, experiments 2-4 on the task's examples."
    out = tmp_path / "out"
    job_run("16_icl.ipynb", tmp_path / "job", task=task, tp=2, pp=2, shots="0,1", limit=8, seeds="1,2",
            max_orders=2, out_dir=out)
    shots = pd.read_csv(out / "shots.csv")
    assert shots.shots.tolist() == [0, 1] and (shots.n == 8).all() and (shots.metric == metric).all()
    for k in (0, 1):                                   # written by the TP2 x PP2 evaluation's ranks
        r = json.loads((out / "eval_seed1" / f"{task}_{k}shot.json").read_text())
        assert r["n"] == 8 and r["shots"] == k
    variants = pd.read_csv(out / "choice_order_format.csv")
    assert set(variants.experiment) == {"as is", "which examples", "order", "format"}
    assert (out / "icl.png").stat().st_size > 10_000


def test_bias_at_tp2_pp2_as_promised_under_load(tmp_path):
    """The promise 15_bias states, beside two busy processes: the TP2 x PP2 draw again (same seed, weights, layout,
    batch size) gives the same text; the one-process HF export gives the continuations the same log-probabilities
    within the notebook's tolerance (the texts may differ where a draw lands within float noise of a step)."""
    from mtnlg.generate import Sampling, generate_run
    out = tmp_path / "out"
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        job_run("15_bias.ipynb", tmp_path / "job", tp=2, pp=2, samples=2, out_dir=out)
        d = pd.read_csv(out / "continuations.csv", keep_default_na=False)
        model, hf = d[d.model == "model"].reset_index(drop=True), d[d.model == "compare"].reset_index(drop=True)
        s = Sampling(max_new_tokens=10, do_sample=True, temperature=1.0, top_p=0.9, seed=1234)
        again = generate_run(out / "tiny_run", list(model.prompt), tp=2, pp=2, sampling=s, batch_size=32)
    finally:
        for h in hogs: h.kill()
    assert [g.text for g in again] == model.text.tolist()               # the same layout: the same text, exactly
    assert len(model) == len(hf) > 50 and (model.prompt == hf.prompt).all()
    assert model.text.nunique() > len(model) // 2                     # and the draws are not one repeated stream
    lp = pd.read_csv(out / "continuation_logprobs.csv", keep_default_na=False)
    assert len(lp) > 50 and (lp["model"] - lp["compare"]).abs().max() < 1e-3     # the notebook's LOGPROB_TOL
    sent = pd.read_csv(out / "sentiment.csv")
    assert set(sent.model) == {"model", "compare"} and ((sent.low <= sent["mean"]) & (sent["mean"] <= sent.high)).all()
    assert set(sent.interval) == {"cluster t"}                         # 2 or 3 prompts a group

ICL_EACH = """
import json, sys
from pathlib import Path
from execnb.nbio import read_nb
from execnb.shell import CaptureShell
nb_path, out, tasks = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
for task in tasks:                                       # one process: the libraries load once for all nine
    nb = read_nb(nb_path)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    params.source += (f"\\ntask = {task!r}\\nlimit = 8\\nshots = '0,1'\\nmax_orders = 2\\n"
                      f"out_dir = {str(out / task)!r}\\ndata = {str(Path(sys.argv[4]))!r}")
    sh = CaptureShell(path=nb_path.parent)
    sh.run_all(nb, exc_stop=True)
    print("done", task, flush=True)
"""


@pytest.fixture(scope="module")
def icl_all(tmp_path_factory):
    "nbs/16_icl.ipynb on each of the nine paper tasks at limit 8, one process (the fixtures as data root)."
    from mtnlg.tasks import PAPER_TASKS
    out = tmp_path_factory.mktemp("icl_all")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", ICL_EACH, str(ROOT / "nbs" / "16_icl.ipynb"), str(out),
                        ",".join(PAPER_TASKS), str(ROOT / "tests" / "data" / "eval")], capture_output=True, text=True,
                       env=env, timeout=1500, cwd=ROOT / "nbs")
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return out


def test_icl_on_every_paper_task(icl_all):
    "Each task's own template shows its fixed examples; 8 documents scored; the pool named (HANS: its training file)."
    from mtnlg.tasks import PAPER_TASKS
    for task in PAPER_TASKS:
        shots = pd.read_csv(icl_all / task / "shots.csv")
        assert shots.shots.tolist() == [0, 1] and (shots.n == 8).all(), task
        variants = pd.read_csv(icl_all / task / "choice_order_format.csv")
        assert {"as is", "which examples", "order", "format"} <= set(variants.experiment), task
        summary = json.loads((icl_all / task / "summary.json").read_text())
        assert summary["shots_from"]["fixed_examples"] == variants.shots_from[0], task
    hans = json.loads((icl_all / "hans" / "summary.json").read_text())["shots_from"]
    assert hans["experiment_1"] == "train" and hans["fixed_examples"].startswith("train")


def test_race_h_examples_come_from_articles_never_scored(icl_all):
    "RACE-h: no fixed example is a question of a scored article (its later questions hold the earlier answers)."
    from mtnlg.tasks import lm_eval_task, task_config
    docs = list(lm_eval_task(task_config("race_h", 2, ROOT / "tests" / "data" / "eval")).eval_docs)
    scored = {d["article_id"] for d in docs[:8]}
    examples = json.loads((icl_all / "race_h" / "examples.json").read_text())
    used = [e for s in examples.values() for e in s]
    assert used and not {e["article_id"] for e in used} & scored
    # the control: the documents right after the scored ones (the old choice by position) share a scored article
    assert {d["article_id"] for d in docs[8:8 + 4]} & scored
