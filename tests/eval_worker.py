"""One rank of tests/test_eval.py's TP2 x PP2 x DP2 launch, two jobs on the same 8 processes, one after the other:
1. generative requests: rank 0 drives `MtnlgLM` while the other ranks follow, then scores a request to show the
   forward rounds go on; rank 0 writes the answers to OUT.json;
2. `mtnlg eval` as each of its launched ranks runs it (`python -m mtnlg.eval FLAGS`: the same parser, `cli_run`
   under `rank_entry`), on the process groups of 1 (`init_distributed` keeps a layout's groups: a process group
   cannot be made again under one torchrun), ending with its own shutdown; rank 0's printed JSON goes to
   OUT.printed.json.
Usage: torchrun --nproc-per-node=8 tests/eval_worker.py RUN_DIR OUT.json [MTNLG_EVAL_FLAGS...]"""
import argparse, json, os, sys, warnings
from contextlib import redirect_stdout
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
from lm_eval.api.instance import Instance
from mtnlg import eval as ev
from mtnlg.jobs import rank_entry
from mtnlg.topology import shutdown
from mtnlg import runs as RN

REQUESTS = [("The quick brown fox", {"until": ["\n\n"], "max_gen_toks": 8}),
            ("Hello", {"until": ["."], "max_gen_toks": 6}),
            ("In the beginning God created", {"until": ["\n"], "max_gen_toks": 8, "do_sample": True,
                                              "temperature": 0.8})]
SCORED = ("The king", " is dead")
# several batches of one setting: pipelined at PP2 (both stages decode at once), greedy and sampled
PROMPTS = ["Once upon a time", "The river", "A", "It was the best of times, it was", "Hello world", "Why"]
BATCHED = [dict(max_new_tokens=6), dict(max_new_tokens=6, do_sample=True, temperature=0.9, seed=7)]


def eval_ranks(flags: list[str], printed: str) -> int:
    "What `python -m mtnlg.eval FLAGS` runs on each rank (`mtnlg.eval._rank_main`); rank 0's stdout into `printed`."
    args = ev.cli_parser(argparse.ArgumentParser(prog="python -m mtnlg.eval")).parse_args(flags)
    if int(os.environ["RANK"]): return rank_entry(lambda: ev.cli_run(args))
    with open(printed, "w") as f, redirect_stdout(f): return rank_entry(lambda: ev.cli_run(args))


def generation(run: str, out: str) -> None:
    "Rank 0 decodes and scores through `MtnlgLM` on the layout while the other ranks follow; rank 0 writes `out`."
    scorer, _ = ev.load_model_for_eval(run, batch_size=4, tp=2, pp=2, dp=2)
    tok = RN.run_tokenizer(run)
    if scorer.topo.rank:
        ev.follow_forwards(scorer, tok)
    else:
        ev.lead_forwards(scorer)
        lm = ev.MtnlgLM(scorer, tok)
        try:
            texts = lm.generate_until([Instance("generate_until", {}, a, i) for i, a in enumerate(REQUESTS)])
            [(ll, _)] = lm.loglikelihood([Instance("loglikelihood", {}, SCORED, 0)])
            batched = [[g.text for g in lm.generator.generate(PROMPTS, batch_size=2, **kw)] for kw in BATCHED]
        finally:
            ev.stop_followers(scorer)
        with open(out, "w") as f:
            json.dump({"texts": texts, "generator": type(lm.generator).__name__, "loglikelihood": ll,
                       "batched": batched}, f)


if __name__ == "__main__":
    run, out, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    generation(run, out)
    if not flags: shutdown()
    elif eval_ranks(flags, out + ".printed.json"): sys.exit(1)
