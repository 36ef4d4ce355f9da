"""One rank of the TP2 x PP2 x DP2 test of generative requests in evaluation: rank 0 drives `MtnlgLM` while the other
ranks follow, then scores a request to show the forward rounds go on; rank 0 writes the answers as JSON.
Usage: torchrun --nproc-per-node=8 tests/eval_worker.py RUN_DIR OUT.json"""
import json, sys, warnings
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
from lm_eval.api.instance import Instance
from mtnlg import eval as ev
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


if __name__ == "__main__":
    run, out = sys.argv[1], sys.argv[2]
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
    shutdown()
