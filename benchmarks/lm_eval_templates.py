"""CPU seconds lm-eval spends building few-shot prompts, its Jinja templates compiled on every render (lm-eval 0.4.13
as shipped) against once per process (`mtnlg.patches.cache_lm_eval_templates`, which `task_config` applies).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lm_eval_templates.py [--limit 40] [--repeats 2]

Each measurement is a fresh process that builds every request of the tasks below at 5 shots through lm-eval
(`evaluate_task` with a model that scores nothing), the two ways alternating; the requests' digest must be equal.
Writes benchmarks/lm_eval_templates.json: CPU seconds of each run and the ratio of the medians.
"""
import argparse, hashlib, json, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "eval"       # the suite's evaluation sets
TASKS, SHOTS = ("hellaswag", "piqa", "winogrande", "lambada"), 5


def child(cached: bool, limit: int):
    "Build the requests one way; print {cpu_s, digest, compiles}."
    import lm_eval.utils
    from unittest.mock import patch
    from mtnlg.eval import MtnlgLM, evaluate_task
    from mtnlg.tokenizer import get_tokenizer
    if not cached: lm_eval.utils.apply_template.compiled_once = True     # cache_lm_eval_templates then leaves it
    digest = hashlib.sha256()
    class Requests(MtnlgLM):
        @property
        def max_length(self) -> int: return 2048
        def loglikelihood(self, requests, disable_tqdm: bool = False):
            for r in requests: digest.update(repr(r.args).encode())
            return [(0.0, False)] * len(requests)
    lm = Requests(scorer=None, tokenizer=get_tokenizer("gpt2"))
    evaluate_task(lm, "piqa", 0, limit=2, data=DATA)                    # imports and first loads, not measured
    with patch.object(lm_eval.utils.env, "compile", wraps=lm_eval.utils.env.compile) as compile_:
        t0 = time.process_time()
        for name in TASKS: evaluate_task(lm, name, SHOTS, limit=limit, data=DATA)
        cpu = time.process_time() - t0
    print(json.dumps({"cpu_s": cpu, "digest": digest.hexdigest(), "compiles": compile_.call_count}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=40)        # documents a task
    ap.add_argument("--repeats", type=int, default=2)       # runs each way, alternating
    ap.add_argument("--child", choices=["cached", "uncached"])
    a = ap.parse_args()
    if a.child: return child(a.child == "cached", a.limit)
    runs = {"uncached": [], "cached": []}
    for _ in range(a.repeats):
        for way in runs:
            p = subprocess.run([sys.executable, __file__, "--child", way, "--limit", str(a.limit)], capture_output=True,
                               text=True, check=True)
            runs[way].append(json.loads(p.stdout.strip().splitlines()[-1]))
    digests = {r["digest"] for way in runs.values() for r in way}
    assert len(digests) == 1, "the two ways built different requests"
    med = {way: statistics.median(r["cpu_s"] for r in rs) for way, rs in runs.items()}
    out = {"date": time.strftime("%Y-%m-%d"), "tasks": TASKS, "shots": SHOTS, "limit": a.limit, "runs": runs,
           "cpu_s_median": med, "cached_over_uncached": med["cached"] / med["uncached"], "same_requests": True}
    text = json.dumps(out, indent=1)
    (ROOT / "benchmarks" / "lm_eval_templates.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
