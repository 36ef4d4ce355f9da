"""Memory of one evaluation process with glibc's malloc defaults and with `cpu_malloc_reuse`, same run (ratio).

Why evaluation does not call `cpu_malloc_reuse` (nbs/07_eval.ipynb, `load_model_for_eval`): its shapes change from
batch to batch, and on a heap without mmap the freed logits of one shape do not fit the next. Each variant runs in
its own process: a random 2-layer GPT-2 (256 positions, the GPT-2 vocabulary) scores HellaSwag 5-shot on the
committed fixtures (tests/data/eval) through `mtnlg.eval.evaluate_task`, batch 16, while a thread samples the
process's resident memory every 0.1 s. Reported: resident MB after loading, peak, at the end, and the peak ratio.

    .venv/bin/python benchmarks/eval_malloc.py [--limit 100 --batch-size 16 --out benchmarks/eval_malloc.json]
"""
import argparse, json, os, platform, shutil, subprocess, sys, tempfile, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resident_mb() -> float:
    "This process's resident memory in MB (/proc/self/statm)."
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def one(variant: str, limit: int, batch_size: int) -> dict:
    "Score HellaSwag 5-shot in this process under `variant` ('glibc_default' or 'malloc_reuse'); memory seen."
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from mtnlg.eval import MtnlgLM, evaluate_task, hf_scorer
    from mtnlg.topology import cpu_malloc_reuse
    if variant == "malloc_reuse": assert cpu_malloc_reuse(), "glibc's mallopt is not available here"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=256, vocab_size=50257))
    lm = MtnlgLM(hf_scorer(model.eval(), batch_size))
    seen, done = [resident_mb()], threading.Event()
    def sample():
        while not done.wait(0.1): seen.append(resident_mb())
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    r = evaluate_task(lm, "hellaswag", 5, limit, ROOT / "tests" / "data" / "eval")
    seconds = time.perf_counter() - t0
    done.set()
    t.join()
    return dict(variant=variant, start_mb=round(seen[0]), peak_mb=round(max(seen)), end_mb=round(resident_mb()),
                seconds=round(seconds, 1), accuracy=r["accuracy"], prompts_over_window=r["window"]["docs_over_window"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=100, help="HellaSwag documents (4 requests each)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)      # one variant, in a child process
    a = ap.parse_args(argv)
    if a.variant:
        print(json.dumps(one(a.variant, a.limit, a.batch_size)))
        return
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    runs = {}
    for v in ("glibc_default", "malloc_reuse"):
        p = subprocess.run([sys.executable, __file__, "--variant", v, "--limit", str(a.limit), "--batch-size",
                            str(a.batch_size)], capture_output=True, text=True, env=env, check=True)
        runs[v] = json.loads(p.stdout.strip().splitlines()[-1])
        print(runs[v])
    assert runs["glibc_default"]["accuracy"] == runs["malloc_reuse"]["accuracy"]        # the same scores
    out = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=platform.processor() or platform.machine(),
               cpus=os.cpu_count(), limit=a.limit, batch_size=a.batch_size, runs=runs,
               peak_ratio_reuse_over_default=round(runs["malloc_reuse"]["peak_mb"] / runs["glibc_default"]["peak_mb"], 2))
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))
    if a.out: Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
