"""The in-context-learning and bias studies at the settings a user passes as papermill parameters: ICL on every paper
task (one process), on HellaSwag (its prompts read the `query` its process_docs builds) and RACE-h, and both studies
on a TP2 x PP2 checkpoint, every section on the layout and equal to one process within a stated tolerance. The
TP2 x PP2 studies share one launch (tests/studies_worker.py lends the ranks to each study's notebook in turn; a
session started from a papermill job runs in tests/test_jobs.py). Their default settings (PIQA, one process) run in
tests/test_notebooks.py."""
import json, os, subprocess, sys
from pathlib import Path
import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, LAUNCHER_VARS
import studies_worker as W

pytestmark = pytest.mark.slow      # the studies launch TP2 x PP2 ranks


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """tests/studies_worker.py: nbs/16_icl.ipynb on each of the nine paper tasks at `W.limit` documents (one process,
    the fixtures as data root), then the TP2 x PP2 studies on one launch; its output folder."""
    out = tmp_path_factory.mktemp("studies")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "studies_worker.py"), str(out),
                        str(ROOT / "tests" / "data" / "eval")], capture_output=True, text=True, env=env, timeout=2400,
                       cwd=ROOT / "nbs")
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return out


@pytest.fixture(scope="module")
def icl_all(studies): return studies / "one"


def test_the_studies_share_one_launch_and_end_it(studies, tmp_path):
    """The three TP2 x PP2 studies ran on the one launch, each on the weights it made (the digests of its own tiny
    model equal the ranks'), each closed its session, and the ranks ended cleanly. The control: other weights
    (another seed) have other digests, so the lending check would refuse them."""
    from mtnlg.generate import demo_checkpoint
    ranks = json.loads((studies / "tp2pp2" / "ranks.json").read_text())
    assert [Path(s).parent.name for s in ranks["lent"]] == list(W.STUDIES) and ranks["closes"] == len(W.STUDIES)
    assert ranks["launcher_exit"] == 0
    assert all(W.weights(s) == W.weights(studies / "tp2pp2" / "tiny_run") for s in ranks["lent"])
    assert W.weights(demo_checkpoint(tmp_path / "other", seed=1)) != W.weights(ranks["lent"][0])


@pytest.mark.parametrize("task,metric", [("hellaswag", "acc_norm"), ("race_h", "acc_mutual_info")])
def test_icl_at_tp2_pp2_as_one_process(studies, icl_all, task, metric):
    """Every experiment on the TP2 x PP2 ranks, started once (`mtnlg.session`): the shot counts' results written by
    them, and the study's numbers those of one process (`icl_all`, same model and settings): each document's
    log-likelihoods within 1e-4 (fp32, the layout's sums in another order: about 1e-5 here), so the same correct
    answers (no margin is that close), the same accuracies."""
    out = studies / "tp2pp2" / f"icl_{task}"
    shots = pd.read_csv(out / "shots.csv")
    n = W.ICL["limit"]
    assert shots.shots.tolist() == [0, 1] and (shots.n == n).all() and (shots.metric == metric).all()
    for k in (0, 1):                                   # written by the TP2 x PP2 evaluation's ranks
        r = json.loads((out / "eval_seed1" / f"{task}_{k}shot.json").read_text())
        one = json.loads((icl_all / task / "eval_seed1" / f"{task}_{k}shot.json").read_text())
        assert r["n"] == n and r["shots"] == k and r["correct"] == one["correct"]
    variants = pd.read_csv(out / "choice_order_format.csv")
    assert set(variants.experiment) == {"as is", "which examples", "order", "format"}
    assert (variants.accuracy == pd.read_csv(icl_all / task / "choice_order_format.csv").accuracy).all()
    docs, ref = (pd.read_csv(d / "documents.csv") for d in (out, icl_all / task))
    assert len(docs) == len(ref) >= n * 4 and (docs.correct == ref.correct).all()
    lls, ref_lls = (np.array([json.loads(x) for x in d.loglikelihoods]) for d in (docs, ref))
    assert np.abs(lls - ref_lls).max() < 1e-4
    # the control: the comparison sees a change of examples (set 2's log-likelihoods are not set 1's)
    sets = [lls[(docs.variant == v).to_numpy()] for v in ("set 1", "set 2")]
    assert np.abs(sets[0] - sets[1]).max() > 1e-2
    assert (out / "icl.png").stat().st_size > 10_000


def test_bias_at_tp2_pp2_as_promised_under_load(studies):
    """The promise 15_bias states: the TP2 x PP2 draw again on the same ranks, beside two busy processes (same seed,
    weights and layout, another batch size: 1 against the study's 16) gives the same text; every section ran on the
    layout, and its numbers are those of one process (the HF export of the same weights) within 1e-4: the next-word
    log ratios and the continuations' log-probabilities (the texts may differ where a draw lands within float noise
    of a step). The draw again takes the study's first batch of rows (`AGAIN_ROWS`), at every place of it."""
    out = studies / "tp2pp2" / "bias"
    ranks = json.loads((studies / "tp2pp2" / "ranks.json").read_text())
    d = pd.read_csv(out / "continuations.csv", keep_default_na=False)
    model, hf = d[d.model == "model"].reset_index(drop=True), d[d.model == "compare"].reset_index(drop=True)
    assert W.AGAIN == dict(max_new_tokens=10, do_sample=True, temperature=1.0, top_p=0.9, seed=1234, per_row=True)
    again = model.text.tolist()[:W.AGAIN_ROWS]
    assert ranks["study_batch"] == 16 and ranks["again"] == again and len(again) == 16   # the same layout: the same text
    assert len(model) == len(hf) == 46 and (model.prompt == hf.prompt).all()     # each prompt of every study once
    assert model.text.nunique() > len(model) // 2                     # and the draws are not one repeated stream
    lp = pd.read_csv(out / "continuation_logprobs.csv", keep_default_na=False)
    assert len(lp) > 40 and (lp["model"] - lp["compare"]).abs().max() < 1e-4     # the notebook's LOGPROB_TOL
    prob = pd.read_csv(out / "occupation_word_probabilities.csv")
    a, b = (prob[prob.model == m].log_f_over_m.to_numpy() for m in ("model", "compare"))
    assert len(a) == 16 and np.abs(a - b).max() < 1e-4
    assert np.abs(a - np.roll(b, 1)).max() > 1e-2 and (lp["model"] - lp["compare"].shift(1)).abs().max() > 1e-2   # controls
    from mtnlg.stats import NO_SPREAD
    sent = pd.read_csv(out / "sentiment.csv")
    shown = sent[sent.interval != NO_SPREAD]                          # flagged rows have no bounds
    assert set(sent.model) == {"model", "compare"} and ((shown.low <= shown["mean"]) & (shown["mean"] <= shown.high)).all()
    assert set(shown.interval) == {"cluster t"} and ((shown.low >= -1) & (shown.high <= 1)).all()   # in VADER's range
    assert sent[sent.interval == NO_SPREAD].low.isna().all()


def test_icl_on_every_paper_task(icl_all):
    """Each task's own template shows its fixed examples; `W.limit(task)` documents scored; the examples come from
    the pool the summary names (checked against the task's documents, not against the notebook's own variable), none
    a scored document or its twin; every experiment's table counts the prompts over the window."""
    from mtnlg.tasks import PAPER_TASKS, lm_eval_task, task_config
    from mtnlg.twins import is_twin
    key = lambda d: json.dumps(d, sort_keys=True, default=str)
    for task in PAPER_TASKS:
        n = W.limit(task)
        shots = pd.read_csv(icl_all / task / "shots.csv")
        assert shots.shots.tolist() == [0, 1] and (shots.n == n).all(), task
        variants = pd.read_csv(icl_all / task / "choice_order_format.csv")
        assert {"as is", "which examples", "order", "format"} <= set(variants.experiment), task
        assert {"prompts_over_window", "twins_left_out"} <= set(shots.columns) & set(variants.columns), task
        named = json.loads((icl_all / task / "summary.json").read_text())["shots_from"]["fixed_examples"]
        t = lm_eval_task(task_config(task, 1, ROOT / "tests" / "data" / "eval"))
        evaluated = list(t.eval_docs)
        split = evaluated[n:] if named.startswith(t.config.test_split + " after") else list(t.fewshot_docs())
        examples = [e for s in json.loads((icl_all / task / "examples.json").read_text()).values() for e in s]
        in_split = lambda docs: {key(d) for d in docs} <= {key(d) for d in split}
        assert examples and in_split(examples), (task, named)
        assert not in_split(evaluated[:1]), task                       # control: a scored document is not in it
        scored = [t.shown(d) for d in evaluated[:n]]
        assert not any(is_twin(s, t.shown(e)) for s in scored for e in examples), task
    hans = json.loads((icl_all / "hans" / "summary.json").read_text())["shots_from"]
    assert hans["experiment_1"] == "train" and hans["fixed_examples"].startswith("train")


def test_race_h_examples_come_from_articles_never_scored(icl_all):
    "RACE-h: no fixed example is a question of a scored article (its later questions hold the earlier answers)."
    from mtnlg.tasks import lm_eval_task, task_config
    docs = list(lm_eval_task(task_config("race_h", 2, ROOT / "tests" / "data" / "eval")).eval_docs)
    n = W.limit("race_h")
    scored = {d["article_id"] for d in docs[:n]}
    examples = json.loads((icl_all / "race_h" / "examples.json").read_text())
    used = [e for s in examples.values() for e in s]
    assert used and not {e["article_id"] for e in used} & scored
    # the control: the documents right after the scored ones (the old choice by position) share a scored article
    assert {d["article_id"] for d in docs[n:n + 4]} & scored
