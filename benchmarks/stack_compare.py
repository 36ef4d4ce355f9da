"""The default stack (.venv: Python 3.12, torch 2.15, megatron-core 0.19) against the oldest supported one
(.venv-oldest: Python 3.11, torch 2.13, megatron-core 0.16), same machine, same run, as ratios.

One probe process per stack and round, the stacks alternated (A B A B ...) so that a drift of the machine's speed
falls on both. Each probe (one process, world size 1) builds the same model through mtnlg's own path (DeepSpeed's
pipeline engine, bf16, ZeRO-1), and times, after a warm-up: training steps, a checkpoint save and load
(`mtnlg.checkpoint`), and scoring LAMBADA documents through lm-eval (`mtnlg.eval`, the committed fixture); also
`import torch` (seconds, resident MB after it) and a 512 x 1024 x 1024 bf16 matrix product. Prints a
JSON line per probe, then the medians per stack and new/old. Run from the repository root (both venvs made:
`make env` and `make env ENV=oldest`):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/stack_compare.py [--rounds 5] [--out benchmarks/stack_compare.json]
"""
import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STACKS = {"default": ROOT / ".venv/bin/python", "oldest": ROOT / ".venv-oldest/bin/python"}
MEASURES = ("train_step_s", "save_s", "load_s", "eval_doc_s", "import_torch_s", "import_torch_mb", "bf16_gemm_ms")


def probe(a):
    "This process's stack: seconds a training step, a checkpoint save and load, and a scored document (medians)."
    import resource
    t0 = time.perf_counter()
    import torch
    import_s, import_mb = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    x, w = torch.randn(512, 1024, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16)
    for _ in range(3): x @ w
    t0 = time.perf_counter()
    for _ in range(20): x @ w
    gemm_ms = (time.perf_counter() - t0) / 20 * 1000
    from mtnlg.config import load_config, save_config
    from mtnlg.topology import init_distributed, shutdown
    from mtnlg.model import init_parameters
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.checkpoint import save_checkpoint, load_checkpoint
    cfg = load_config("tiny", overrides={"layers": a.layers, "hidden": a.hidden, "heads": 8, "seq": a.seq,
                                         "micro_batch": 2, "global_batch": 8, "precision": "bf16", "zero": 1})
    topo = init_distributed(cfg.parallel, timeout_s=600, run_cfg=cfg)
    engine = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed))
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, cfg.model.vocab_size, (8, cfg.model.seq_length + 1), generator=g)
    micro = [(m[:, :-1], m[:, 1:]) for m in batch.split(2)]
    steps = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        engine.train_batch(iter(micro))
        if i >= a.warmup: steps.append(time.perf_counter() - t0)
    run = Path(a.dir)
    save_config(cfg, run / "config.json")
    state = dict(step=1, consumed_samples=8, tokens=0, skipped=0)
    saves, loads, ck = [], [], None
    for _ in range(3):
        t0 = time.perf_counter()
        ck = save_checkpoint(engine, topo, cfg, run, dict(state))
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        load_checkpoint(engine, topo, cfg, ck, dict(state, layout=None))
        loads.append(time.perf_counter() - t0)
    shutdown()
    from mtnlg.eval import MtnlgLM, load_model_for_eval, evaluate_task
    from mtnlg.runs import run_tokenizer
    scorer, _ = load_model_for_eval(run, batch_size=8)
    lm = MtnlgLM(scorer, run_tokenizer(run))
    evaluate_task(lm, "lambada", 0, limit=8, data=a.data)                # warm-up
    t0 = time.perf_counter()
    r = evaluate_task(lm, "lambada", 0, limit=a.limit, data=a.data)
    eval_s = (time.perf_counter() - t0) / r["n"]
    med = statistics.median
    import megatron.core, deepspeed
    print(json.dumps(dict(python=platform.python_version(), torch=torch.__version__.split("+")[0],
                          megatron_core=megatron.core.__version__.split("+")[0], deepspeed=deepspeed.__version__,
                          train_step_s=med(steps), save_s=med(saves), load_s=med(loads), eval_doc_s=eval_s,
                          import_torch_s=import_s, import_torch_mb=import_mb, bf16_gemm_ms=gemm_ms)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="probes of each stack, alternated")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--limit", type=int, default=48, help="LAMBADA documents scored")
    ap.add_argument("--data", default=str(ROOT / "tests/data/eval"))
    ap.add_argument("--out", default=None, help="also write the result as JSON here")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.probe: return probe(a)
    missing = [str(p) for p in STACKS.values() if not p.exists()]
    if missing: sys.exit(f"stack_compare: {', '.join(missing)} missing: make env && make env ENV=oldest")
    args = [f"--{k}={v}" for k, v in vars(a).items() if k in ("layers", "hidden", "seq", "warmup", "steps", "limit",
                                                               "data")]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.pop("PYTHONPATH", None)
    rows = {k: [] for k in STACKS}
    for i in range(a.rounds):
        for stack, py in STACKS.items():
            with tempfile.TemporaryDirectory(prefix="mtnlg-stack-") as d:
                p = subprocess.run([str(py), __file__, "--probe", f"--dir={d}/run", *args], capture_output=True,
                                   text=True, env=env, cwd=ROOT)
            if p.returncode: sys.exit(f"probe of {stack} failed:\n{p.stderr[-4000:]}")
            row = json.loads(p.stdout.strip().splitlines()[-1])
            rows[stack].append(row)
            print(json.dumps(dict(round=i, stack=stack, **row)), flush=True)
    med = {s: {m: statistics.median(r[m] for r in rs) for m in MEASURES} for s, rs in rows.items()}
    out = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=f"{platform.machine()}, "
               f"{os.cpu_count()} CPUs", model=dict(layers=a.layers, hidden=a.hidden, seq=a.seq), rounds=a.rounds,
               versions={s: {k: rs[0][k] for k in ("python", "torch", "megatron_core", "deepspeed")}
                         for s, rs in rows.items()},
               medians=med, new_over_old={m: round(med["default"][m] / med["oldest"][m], 3) for m in MEASURES},
               pairwise={m: [round(n[m] / o[m], 3) for n, o in zip(rows["default"], rows["oldest"])] for m in MEASURES})
    print(json.dumps(out, indent=1))
    if a.out: Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
