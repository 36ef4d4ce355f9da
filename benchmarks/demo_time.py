"""Where `make demo`'s time goes, measured by parts in ONE run (so the ratios hold on a noisy shared machine).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/demo_time.py [--parts micro,train,eval,demo] [--steps 12] [--limit 20]

micro: one process, the demo model (bf16, micro-batch 4 x its window, TP1): seconds per micro-batch forward+backward of
       the body (embedding, 4 blocks, final norm) against the head (tied logits over the 50257 vocabulary + cross
       entropy), with glibc's malloc defaults and after `cpu_malloc_reuse`; the top operators (torch.profiler).
train: the real demo training (TP2 x PP2 x DP2, 8 gloo processes) for --steps steps with a validation and a
       checkpoint every --steps/2 steps, for each --batches global batch and --malloc setting (MTNLG_CPU_MALLOC);
       the metrics file is watched, so the run's wall time splits into process start, steps, the gaps between
       steps (validations, checkpoints) and the end (last checkpoint, plot, exit).
eval:  the run's final checkpoint scored on every (task, shots) pair of the demo with --limit examples, first with
       glibc's malloc defaults, then after `cpu_malloc_reuse`; seconds extrapolated to --full examples per pair, and
       how many prompts exceeded the model's window.
demo:  `mtnlg demo` end to end into a new folder (the corpus from the cache when it is there): wall time, the stage
       times it records, the quality filter's removals, prompts over the window, accuracies.
Prints one JSON object (also written to --json).
"""
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def part_micro(reps: int = 3) -> dict:
    "Body vs head seconds per micro-batch forward+backward of the demo model (one process)."
    import torch
    from mtnlg.config import load_config, ParallelConfig
    from mtnlg.topology import init_distributed, seed_all, apply_cpu_patches, shutdown
    from mtnlg.model import GPT, tied_logits, lm_loss
    apply_cpu_patches()
    cfg = load_config("demo").model
    topo = init_distributed(ParallelConfig())
    seed_all(1234, topo)
    m = GPT(cfg).to(torch.bfloat16)
    tok = torch.randint(0, cfg.vocab_size, (4, cfg.seq_length))
    lab = torch.randint(0, cfg.vocab_size, (4, cfg.seq_length))

    def body():
        x = m.embedding(tok)
        for b in m.blocks: x = b(x)
        return m.final_norm(x)

    def head(x):
        return lm_loss(tied_logits(m.embedding, x), lab, cfg.vocab_size)

    def once():
        t0 = time.perf_counter()
        x = body()
        xd = x.detach().requires_grad_()
        t1 = time.perf_counter()
        loss = head(xd)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        x.backward(xd.grad)
        t4 = time.perf_counter()
        return dict(body_fwd=t1 - t0, head_fwd=t2 - t1, head_bwd=t3 - t2, body_bwd=t4 - t3)

    def best():
        once()
        runs = [once() for _ in range(reps)]
        r = {k: round(min(x[k] for x in runs), 4) for k in runs[0]}
        r["head_share"] = round((r["head_fwd"] + r["head_bwd"]) / sum(r.values()), 3)
        return r

    from mtnlg.topology import cpu_malloc_reuse
    out = dict(glibc_default=best())                 # glibc's malloc defaults, then cpu_malloc_reuse (as `train`)
    out["malloc_reuse_set"] = cpu_malloc_reuse()
    out["malloc_reuse"] = best()
    total = lambda r: sum(v for k, v in r.items() if k != "head_share")
    out["speedup"] = round(total(out["glibc_default"]) / total(out["malloc_reuse"]), 2)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        r = once()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
    out["top_ops_ms"] = {e.key: round(e.self_cpu_time_total / 1e3, 1) for e in ops}
    shutdown()
    return out


def part_train(blend, steps: int, batch: str, out: Path, malloc: str = "1") -> dict:
    "Real demo training for `steps` steps at `batch` ('GLOBAL[xMICRO][@SEQ]'); wall time split by metrics.jsonl."
    batch_seq, _, seq = batch.partition("@")
    gb, _, mb = batch_seq.partition("x")
    run = out / f"train-b{batch.replace('@', 's')}-malloc{malloc}"
    half = max(1, steps // 2)
    ov = ["--preset", "demo", "--data", str(blend), "--set", "data.split=90,8,2", "--steps", str(steps),
          "--set", f"optim.global_batch={gb}", "--set", f"optim.rampup_batch_start={gb}",   # no ramp-up
          "--set", f"optim.rampup_batch_increment={gb}",
          *(["--micro-batch", mb] if mb else []), *(["--set", f"model.seq_length={seq}"] if seq else []),
          "--set", f"eval_interval={half}", "--set", f"save_interval={half}", "--out", str(run), "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MTNLG_CPU_MALLOC=malloc)   # 0: glibc's defaults
    t0 = time.time()
    p = subprocess.Popen([str(Path(sys.executable).parent / "mtnlg"), "train", *ov], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen, stamps = 0, []
    metrics = run / "metrics.jsonl"
    while p.poll() is None:
        n = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        stamps += [time.time()] * (n - seen)
        seen = n
        time.sleep(0.05)
    wall = time.time() - t0
    if p.returncode: raise SystemExit(f"training failed: {p.stderr.read()[-3000:]}")
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    stamps += [time.time()] * (len(recs) - len(stamps))
    step_s = [r["step_time_s"] for r in recs]
    # seconds between two records beyond the later step's own time: a checkpoint after the earlier record, a
    # validation before the later one (as in `train`), metrics and batch loading
    gaps = {recs[i + 1]["step"]: round(stamps[i + 1] - stamps[i] - step_s[i + 1], 2) for i in range(len(recs) - 1)}
    extra = {k: v for k, v in gaps.items() if v >= 0.3}
    start = stamps[0] - t0 - step_s[0]
    srt = sorted(step_s[1:])
    seq_len = int(json.loads((run / "config.json").read_text())["model"]["seq_length"])
    return dict(global_batch=batch, seq_length=seq_len, tokens_per_step=int(gb) * seq_len, malloc_reuse=malloc, steps=steps, mem_bytes_max=max(r.get("mem_bytes", 0) for r in recs), wall_s=round(wall, 1), start_s=round(start, 1),
                step_median_s=round(srt[len(srt) // 2], 3), steps_total_s=round(sum(step_s), 1),
                between_steps_s=round(sum(gaps.values()), 1), val_or_ckpt_gaps_s=extra, end_s=round(wall - (stamps[-1] - t0), 1), run=str(run),
                loss_first_last=(recs[0]["loss"], recs[-1]["loss"]))


def part_eval(run, limit: int, tasks: str, shots: str, full: int) -> dict:
    "Seconds per (task, shots) pair at `limit` examples, glibc's malloc defaults then `cpu_malloc_reuse`, scaled to `full`."
    from mtnlg.eval import load_model_for_eval, evaluate
    from mtnlg.runs import run_tokenizer
    from mtnlg.topology import shutdown, cpu_malloc_reuse
    from mtnlg.demo import _eval_data
    data = _eval_data()
    scorer, ck = load_model_for_eval(run)
    tok = run_tokenizer(run)
    out = {}
    for variant in ("glibc_default", "malloc_reuse"):
        if variant == "malloc_reuse": out["malloc_reuse_set"] = cpu_malloc_reuse()
        per, over = {}, {}
        for t in tasks.split(","):
            for k in shots.split(","):
                t0 = time.time()
                r = evaluate(scorer, t, k, limit=limit, data=data, log=None, write=False, tokenizer=tok)[0]
                per[f"{t}/{k}"] = round(time.time() - t0, 2)
                over[f"{t}/{k}"] = r["window"]["docs_over_window"]
        out[variant] = dict(per_pair_s=per, total_s=round(sum(per.values()), 1),
                            extrapolated_s=round(sum(per.values()) * full / limit, 1), prompts_over_window=over)
    shutdown()
    return out


def part_demo(out: Path) -> dict:
    "`mtnlg demo` end to end into a new folder, as `make demo` runs it: wall time, its stage times, what each showed."
    import resource
    run = out / "demo"
    cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN))
    t0, c0 = time.time(), cpu()
    p = subprocess.run([str(Path(sys.executable).parent / "mtnlg"), "demo", "--out", str(run), "--fresh"],
                       env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    wall, cpu_s = time.time() - t0, cpu() - c0         # CPU seconds of the demo and every process under it
    if p.returncode: raise SystemExit(f"mtnlg demo failed: {p.stderr[-3000:]}")
    s = json.loads((run / "demo.json").read_text())
    results = json.loads((Path(s["eval_dir"]) / "results.json").read_text())
    report = json.loads((Path(s["blend"]).parent / "report.json").read_text())["sources"]
    metrics = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in metrics if r.get("val_loss") is not None]
    return dict(wall_s=round(wall, 1), cpu_s=round(cpu_s, 1), load_avg_after=os.getloadavg(), **s["times"], steps=len(metrics), tokens=metrics[-1]["tokens"],
                step_median_s=sorted(r["step_time_s"] for r in metrics)[len(metrics) // 2],
                val_loss_first_last=(val[0], val[-1]),
                accuracy={f"{r['task']}/{r['shots']}": round(r["accuracy"], 3) for r in results},
                prompts_over_window={f"{r['task']}/{r['shots']}": r["window"]["docs_over_window"] for r in results},
                quality_filter={n: dict(scored=r["scored"], removed=r["low_quality"]) for n, r in report.items()
                                if r["scored"]})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="micro,train,eval")
    ap.add_argument("--steps", type=int, default=12, help="training steps per measured run")
    ap.add_argument("--batches", default="32",
                    help="global batches (GLOBAL[xMICRO][@SEQ], SEQ the window; comma-separated)")
    ap.add_argument("--malloc", default="0,1", help="MTNLG_CPU_MALLOC values to train with (0: glibc defaults)")
    ap.add_argument("--limit", type=int, default=20, help="examples per (task, shots) pair measured")
    ap.add_argument("--full", type=int, default=200, help="examples per pair to extrapolate to")
    ap.add_argument("--shots", default="0,1,5")
    ap.add_argument("--tasks", default="lambada,piqa,hellaswag")
    ap.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="demo_time-"))
    out.mkdir(parents=True, exist_ok=True)
    parts, res = a.parts.split(","), dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cpus=os.cpu_count())
    if "micro" in parts:
        res["micro"] = part_micro()
        print(json.dumps(res["micro"]), flush=True)
    run = None
    if "train" in parts:
        from mtnlg.corpus import prepare_demo_corpus
        from mtnlg.demo import _eval_data
        t0 = time.time()
        blend = prepare_demo_corpus(eval_dir=_eval_data(), log=None)
        res["corpus_s"] = round(time.time() - t0, 1)
        res["train"] = []
        for b in a.batches.split(","):
            for m in a.malloc.split(","):
                res["train"].append(part_train(blend, a.steps, b, out, m))
                print(json.dumps(res["train"][-1]), flush=True)
        run = res["train"][-1]["run"]
    if "eval" in parts:
        if run is None: raise SystemExit("eval needs the train part (its checkpoint)")
        res["eval"] = part_eval(run, a.limit, a.tasks, a.shots, a.full)
        print(json.dumps(res["eval"]), flush=True)
    if "demo" in parts:
        res["demo"] = part_demo(out)
        print(json.dumps(res["demo"]), flush=True)
    if a.json: Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
