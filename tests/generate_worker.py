"""One rank of the TP x PP generation test: every decoding case of tests/test_generate.py, written as JSON by rank 0.
Usage: torchrun --nproc-per-node=N tests/generate_worker.py RUN_DIR OUT.json TP PP"""
import json, sys, warnings
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
from dataclasses import asdict
from mtnlg.generate import load_generator, generate_until
from mtnlg.topology import shutdown

PROMPTS = ["The quick brown fox", "Hello", "In the beginning God created the heaven and the earth"]
SAMPLE = dict(do_sample=True, temperature=0.9, top_k=40, top_p=0.95, seed=11, max_new_tokens=12)
# 12 copies of one prompt (the bias notebook's settings): each copy is its own request with its own stream
COPY = "The nurse was a"
COPY_SAMPLE = dict(do_sample=True, temperature=1.0, top_p=0.9, max_new_tokens=10, seed=1234)
COPY_KWARGS = {"until": ["\n\n"], "do_sample": True, "temperature": 1.0, "top_p": 0.9, "max_gen_toks": 10}


def cases(gen) -> dict:
    "Every case, as lists of generated tokens (and texts for the lm-eval hook)."
    toks = lambda gs: [g.tokens for g in gs]
    return {"greedy": toks(gen.generate(PROMPTS, max_new_tokens=12)),
            "greedy_nocache": toks(gen.generate(PROMPTS, max_new_tokens=12, use_cache=False)),
            "sample": toks(gen.generate(PROMPTS, **SAMPLE)),
            "sample_nocache": toks(gen.generate(PROMPTS, use_cache=False, **SAMPLE)),
            "until": generate_until(gen, [(p, {"until": ["\n\n"], "max_gen_toks": 6}) for p in PROMPTS]),
            "copies_bs4": toks(gen.generate([COPY] * 12, batch_size=4, **COPY_SAMPLE)),
            "copies_bs12": toks(gen.generate([COPY] * 12, batch_size=12, **COPY_SAMPLE)),
            "until_copies": generate_until(gen, [(COPY, COPY_KWARGS)] * 12, batch_size=5)}


if __name__ == "__main__":
    run, out, tp, pp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    gen = load_generator(run, tp, pp)
    res = cases(gen)
    if gen.rank0:
        with open(out, "w") as f: json.dump(res, f)
    shutdown()
