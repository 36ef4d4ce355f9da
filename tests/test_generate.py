"""Text generation (mtnlg.generate): greedy at TP2 x PP2 equals transformers' `generate` on the fp32 HF export, token
for token, for a batch of prompts of different lengths; seeded sampling is repeatable and layout-independent; the KV
cache changes no token; bad input fails before any work with one clear line."""
import json, os, subprocess, sys
import pytest
import torch
from mtnlg import generate as G
from mtnlg.cli import main
from conftest import ROOT, LAUNCHER_VARS

sys.path.insert(0, str(ROOT / "tests"))
import generate_worker as W

pytestmark = pytest.mark.slow      # a training run, then 4-process decoding


def _env():
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def model_run(tmp_path_factory):
    """A random model of the tiny preset's shape (4 layers, hidden 64, 64 positions) written as a run's checkpoint in
    this process (decoding a trained run's checkpoint, optimizer state beside the weights: tests/test_hosts.py)."""
    import shutil
    run = G.demo_checkpoint(tmp_path_factory.mktemp("gen") / "run", seq_length=64, num_layers=4)
    shutil.copy(run / "checkpoints" / "step00000000" / "config.json", run / "config.json")   # as `mtnlg train` does
    return run


@pytest.fixture(scope="session")
def tp2pp2(model_run, tmp_path_factory):
    "Every case of generate_worker.py decoded on 4 processes (TP2 x PP2)."
    from mtnlg.jobs import launch_command
    out = tmp_path_factory.mktemp("gen_out") / "tp2pp2.json"
    cmd = launch_command([str(ROOT / "tests" / "generate_worker.py"), str(model_run), str(out), "2", "2"], 4)
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def one(model_run):
    "Every case decoded on this one process."
    gen = G.load_generator(model_run)
    return gen, W.cases(gen)


@pytest.fixture(scope="session")
def hf(model_run, tmp_path_factory):
    from mtnlg.export import export_run
    from transformers import AutoModelForCausalLM
    d = export_run(model_run, tmp_path_factory.mktemp("gen_hf") / "hf", dtype="fp32")
    return d, AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()


def _hf_generate(model, tok, prompts, **kw):
    "transformers' generate on left-padded prompts; the new tokens of each row, cut after its first EOD."
    ids = [tok.tokenize(p) for p in prompts]
    L = max(map(len, ids))
    x = torch.tensor([[tok.eod] * (L - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (L - len(i)) + [1] * len(i) for i in ids])
    out = model.generate(input_ids=x, attention_mask=mask, pad_token_id=tok.eod, **kw)[:, L:].tolist()
    return [r[:r.index(tok.eod) + 1] if tok.eod in r else r for r in out]


def test_greedy_tp2pp2_equals_transformers_generate(tp2pp2, one, hf):
    gen, _ = one
    ref = _hf_generate(hf[1], gen.tok, W.PROMPTS, max_new_tokens=12, do_sample=False)
    assert len({len(gen.tok.tokenize(p)) for p in W.PROMPTS}) == 3          # three prompt lengths in one batch
    assert tp2pp2["greedy"] == ref and one[1]["greedy"] == ref
    # and the comparison can fail: one prompt's continuation differs from that prompt alone after another start
    assert _hf_generate(hf[1], gen.tok, ["Hello there"], max_new_tokens=12, do_sample=False)[0] != ref[1]


def test_seeded_sampling_repeatable_and_layout_independent(tp2pp2, one):
    gen, cases = one
    assert tp2pp2["sample"] == cases["sample"]                              # TP2 x PP2 == one process
    again = [g.tokens for g in gen.generate(W.PROMPTS, **W.SAMPLE)]
    assert again == cases["sample"]
    other = [g.tokens for g in gen.generate(W.PROMPTS, **(W.SAMPLE | {"seed": 12}))]
    assert other != cases["sample"] and cases["sample"] != cases["greedy"]


def test_cache_changes_no_token(tp2pp2, one):
    for c in (tp2pp2, one[1]):
        assert c["greedy_nocache"] == c["greedy"] and c["sample_nocache"] == c["sample"]


def test_hf_model_through_the_same_loop(one, hf):
    gen, cases = one
    hg = G.load_generator(hf[0])
    assert [g.tokens for g in hg.generate(W.PROMPTS, max_new_tokens=12)] == cases["greedy"]


def test_generate_until_for_lm_eval(tp2pp2, one):
    gen, cases = one
    assert tp2pp2["until"] == cases["until"]
    texts = G.generate_until(gen, [(W.PROMPTS[0], {"until": ["\n\n"], "max_gen_toks": 6})])
    assert texts == cases["until"][:1] and len(gen.tok.tokenize(texts[0])) <= 6
    full = gen.generate(W.PROMPTS[0], max_new_tokens=12).text
    stop = full[3:5]
    cut = G.generate_until(gen, [(W.PROMPTS[0], {"until": [stop], "max_gen_toks": 12})])[0]
    assert cut == full[:full.index(stop)]


def test_copies_draw_distinct_streams_at_any_batch_size_and_layout(tp2pp2, one):
    "12 copies of a prompt: 12 distinct draws, the same at batch size 4 and 12, on TP2 x PP2 and one process."
    gen, cases = one
    assert len({tuple(x) for x in cases["copies_bs4"]}) == 12
    assert cases["copies_bs4"] == cases["copies_bs12"] == tp2pp2["copies_bs4"] == tp2pp2["copies_bs12"]
    assert tp2pp2["until_copies"] == cases["until_copies"] and len(set(cases["until_copies"])) == 12
    assert cases["until_copies"] == G.generate_until(gen, [(W.COPY, W.COPY_KWARGS)] * 12, batch_size=12)
    # positive control: streams numbered per batch (the old per-batch seeding) repeat every 4 rows at batch 4
    s = G.Sampling(**W.COPY_SAMPLE)
    ids = [gen.tok.tokenize(W.COPY)] * 4
    per_batch = [r[1] for _ in range(3) for r in gen.generate_ids(ids, s)]
    assert len({tuple(x) for x in per_batch}) == 4
    assert gen.generate([W.COPY] * 3, batch_size=2, first_index=5, **W.COPY_SAMPLE)[0].tokens == \
        cases["copies_bs4"][5]


def test_generate_until_honours_every_lm_eval_kwarg(one):
    gen, _ = one
    ask = lambda kw, n=1: G.generate_until(gen, [(W.COPY, {"until": ["\n\n"]} | kw)] * n)
    greedy = ask({"max_gen_toks": 8})[0]
    for kw in ({"top_k": 1}, {"top_p": 1e-9}, {"temperature": 0}):        # each collapses sampling to argmax
        assert ask({"do_sample": True, "max_gen_toks": 8} | kw, 4) == [greedy] * 4, kw
    assert len(set(ask({"do_sample": True, "max_gen_toks": 8}, 4))) > 1     # the control: sampling differs
    assert len(set(ask({"temperature": 0.7, "max_gen_toks": 8}, 4))) > 1    # lm-eval: temperature > 0 samples
    for alias in ("max_new_tokens", "max_tokens", "max_completion_tokens"):
        assert ask({alias: 2}) == [gen.generate(W.COPY, max_new_tokens=2, stop=["\n\n"]).text], alias
    assert ask({"max_gen_toks": 2}) != [greedy]                             # the control: 8 tokens differ
    assert ask({"until": "\n\n", "max_gen_toks": 8}) == [greedy]            # one stop string as a str
    with pytest.raises(G.GenerateError, match="num_beams"):
        ask({"num_beams": 4, "max_gen_toks": 8})


def test_stream_and_stop_strings(one):
    gen, _ = one
    pieces = []
    g = gen.generate(W.PROMPTS[2], max_new_tokens=12, on_text=pieces.append)
    assert "".join(pieces) == g.text and len(pieces) > 1
    stop = g.text[len(g.text) // 2:len(g.text) // 2 + 3]
    s = gen.generate(W.PROMPTS[2], max_new_tokens=12, stop=[stop])
    assert s.finish == "stop" and stop not in s.text and g.text.startswith(s.text)


def test_cli_streams_one_prompt(model_run, capsys):
    assert main(["generate", "--checkpoint", str(model_run), "--prompt", "Hello", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("Hello")


@pytest.mark.parametrize("argv,msg", [
    (["--prompt", ""], "empty"),
    (["--prompt", "word " * 70, "--max-new-tokens", "4"], "truncate"),
    (["--prompt", "hi", "--max-new-tokens", "64"], "past the context"),
    (["--prompt", "hi", "--sample", "--top-p", "0"], "(0, 1]"),
    (["--prompt", "hi", "--sample", "--top-p", "1.5"], "(0, 1]"),
    (["--prompt", "hi", "--tp", "3"], "--tp 3"),
    (["--prompt", "hi", "--in-flight", "0"], "--in-flight 0"),
    (["--prompts", "/nonexistent/prompts.txt"], "no such file"),
])
def test_bad_input(model_run, capsys, argv, msg):
    assert main(["generate", "--checkpoint", str(model_run), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err


def test_in_flight_reaches_the_ranks():
    import argparse
    from mtnlg.generate import cli_parser, _rank_argv
    base = ["--checkpoint", "c", "--prompt", "hi"]
    parse = lambda argv: cli_parser(argparse.ArgumentParser()).parse_args(base + argv)
    assert parse([]).in_flight is None and "--in-flight" not in _rank_argv(parse([]))
    assert parse(_rank_argv(parse(["--pp", "4", "--in-flight", "1"]))).in_flight == 1     # what a rank parses


def test_left_truncation_keeps_the_end(one):
    gen, _ = one
    long = "word " * 70
    g = gen.generate(long, max_new_tokens=4, truncate="left")
    ids = gen.tok.tokenize(long)[-(gen.dec.max_len - 4):]
    assert g.tokens == gen.generate_ids([ids], G.Sampling(max_new_tokens=4))[0][1]


def test_lm_eval_generative_task_through_the_hook(one):
    "A generative lm-eval task runs with an `LM` whose generate_until is mtnlg.generate.generate_until."
    import datasets, lm_eval
    from lm_eval.tasks import TaskManager
    from mtnlg.eval import MtnlgLM
    gen, _ = one

    class GenLM(MtnlgLM):
        def generate_until(self, requests, disable_tqdm: bool = False):
            return G.generate_until(gen, [r.args for r in requests])

    docs = datasets.DatasetDict({"test": datasets.Dataset.from_list(
        [{"q": p, "a": "x"} for p in W.PROMPTS])})
    cfg = {"task": "toy_generate", "custom_dataset": lambda **_: docs, "test_split": "test",
           "output_type": "generate_until", "doc_to_text": "{{q}}", "doc_to_target": "{{a}}",
           "generation_kwargs": {"until": ["\n\n"], "max_gen_toks": 6}, "metric_list": [{"metric": "exact_match"}]}
    out = lm_eval.simple_evaluate(model=GenLM(scorer=None, tokenizer=gen.tok), tasks=[cfg], log_samples=True,
                                  task_manager=TaskManager(include_defaults=False), bootstrap_iters=0,
                                  verbosity="ERROR")
    got = [s["resps"][0][0] for s in sorted(out["samples"]["toy_generate"], key=lambda s: s["doc_id"])]
    assert got == G.generate_until(gen, [(p, {"until": ["\n\n"], "max_gen_toks": 6}) for p in W.PROMPTS])
    capped = gen.generate(W.PROMPTS, max_new_tokens=6, stop=["\n\n"])     # the same requests: at most 6 tokens
    assert got == [g.text for g in capped] and all(len(g.tokens) <= 6 for g in capped)


# prompts of many lengths, as a study sends them (the bias study's kinds)
PER_ROW_PROMPTS = [t.format(w) for w in ("nurse", "engineer", "Middle Eastern person", "Buddhists", "He", "woman",
                                          "receptionist", "Latinx man")
                   for t in ("The {} was a", "{} are known for", "People would describe the {} as", "{}")]


def test_per_row_text_is_the_same_at_any_batch_size_under_load(tmp_path):
    """`Sampling(per_row=True)`: the same seed and weights give the same text at batch 1 and batch 32 beside two busy
    processes, because every step then runs one row (the decoder sees batches of one). The control: batched, a step
    runs 32 rows, and a row's logits in that batch differ from the row's alone (the arithmetic depends on the batch,
    which per_row takes out; a text difference needs a draw within ~1e-6 of a step and cannot be forced)."""
    from dataclasses import replace
    gen = G.load_generator(G.demo_checkpoint(tmp_path / "run"))
    rows, step = [], gen.dec.step
    def step_seen(cache, tokens, positions, valid):
        "The decoder's own step, noting how many rows it ran."
        rows.append(tokens.shape[0])
        return step(cache, tokens, positions, valid)
    gen.dec.step = step_seen
    s = G.Sampling(max_new_tokens=6, do_sample=True, top_p=0.9, seed=1234, per_row=True)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        alone = [g.text for g in gen.generate(PER_ROW_PROMPTS, s, batch_size=1)]
        rows.clear()
        per_row = [g.text for g in gen.generate(PER_ROW_PROMPTS, s, batch_size=32)]
        per_row_rows, _ = set(rows), rows.clear()
        gen.generate(PER_ROW_PROMPTS, replace(s, per_row=False, max_new_tokens=1), batch_size=32)   # one step
        batched_rows = set(rows)
    finally:
        for h in hogs: h.kill()
    assert per_row == alone and len(set(alone)) > len(alone) // 2
    assert per_row_rows == {1} and max(batched_rows) == 32
    ids = [gen.tok.tokenize(p) for p in PER_ROW_PROMPTS[:32]]
    def first_logits(batch):
        "The first step's logits of a batch of token-id prompts."
        r = G._Rows(gen.tok, gen.dec.new_cache, batch, G.Sampling())
        return step(r.cache, *r.step)
    gap = (first_logits(ids) - torch.cat([first_logits([x]) for x in ids])).abs().max()
    assert 0 < gap < 1e-4, gap
