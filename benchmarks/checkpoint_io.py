"""Checkpoint save/load: mtnlg's sharded format against DeepSpeed's own checkpoint, same model, layout and run.

Every rank of a TP x PP x DP run (default TP2 x PP2 x DP2 on 8 CPU processes, bf16 with ZeRO-1) trains one step,
then saves and loads with both, alternately, `--repeat` times; reported: median seconds of the slowest rank, bytes
written in all and by the busiest rank (a file written by one rank counts for that rank), and the ratios. Also
the planner's figures for the 530B preset. Run (writes a table to stdout and JSON to --out):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/checkpoint_io.py [--layers 8 --hidden 640 --repeat 3]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path


def worker(a):
    import torch, torch.distributed as dist
    from mtnlg.config import load_config
    from mtnlg.topology import init_distributed, shutdown
    from mtnlg.model import init_parameters
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.checkpoint import save_checkpoint, load_checkpoint
    cfg = load_config("tiny", overrides={"layers": a.layers, "hidden": a.hidden, "heads": 8, "vocab": a.vocab,
                                         "seq": 32, "micro_batch": 1, "global_batch": 4, "tp": a.tp, "pp": a.pp,
                                         "dp": a.dp, "zero": 1, "precision": a.precision})
    topo = init_distributed(cfg.parallel, timeout_s=600, run_cfg=cfg)
    engine = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed))
    t = torch.randint(0, cfg.model.vocab_size, (cfg.optim.global_batch // topo.dp, cfg.model.seq_length + 1))
    engine.train_batch(iter([(m[:, :-1], m[:, 1:]) for m in t.split(1)]))
    root = Path(a.dir)
    state = dict(step=1, consumed_samples=4, tokens=0, skipped=0)

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)                    # the step waits for the slowest rank
        return dt.item()
    rows = {k: [] for k in ("mtnlg_save", "mtnlg_load", "deepspeed_save", "deepspeed_load")}
    for i in range(a.repeat):
        ours, ds = root / f"ours{i}", root / f"ds{i}"
        ck = []
        rows["mtnlg_save"].append(timed(lambda: ck.append(save_checkpoint(engine, topo, cfg, ours, state))))
        rows["deepspeed_save"].append(timed(lambda: engine.save_checkpoint(str(ds), tag="t", save_latest=False)))
        rows["mtnlg_load"].append(timed(lambda: load_checkpoint(engine, topo, cfg, ck[0], dict(state, layout=None))))
        rows["deepspeed_load"].append(timed(lambda: engine.load_checkpoint(str(ds), tag="t",
                                                                           load_lr_scheduler_states=False)))
    if topo.rank == 0: Path(a.result).write_text(json.dumps(rows))
    shutdown()


def _bytes(folder: Path) -> tuple[int, int]:
    "(bytes of all files, bytes of the largest single rank's files: DCP __R_0.distcp / DeepSpeed's per-rank files)."
    files = [f for f in folder.rglob("*") if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    per_rank = {}
    for f in files:
        n = f.name
        key = n.split("_")[1] if n.startswith("__") else n.split("rank_")[-1].split("_")[0] if "rank_" in n else n
        per_rank[key] = per_rank.get(key, 0) + f.stat().st_size
    return total, max(per_rank.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=640)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/checkpoint_io.json")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--dir")
    ap.add_argument("--result")
    a = ap.parse_args()
    if a.worker: return worker(a)
    d = Path(tempfile.mkdtemp(prefix="mtnlg-ckbench-"))
    n = a.tp * a.pp * a.dp
    args = [f"--{k}={v}" for k, v in vars(a).items() if k in ("layers", "hidden", "vocab", "tp", "pp", "dp",
                                                                "precision", "repeat")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port", "29617",
           __file__, "--worker", "--dir", str(d), "--result", str(d / "r.json"), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = json.loads((d / "r.json").read_text())
    med = {k: statistics.median(v) for k, v in rows.items()}
    ours, ds = _bytes(d / "ours0" / "checkpoints"), _bytes(d / "ds0")
    from mtnlg.config import load_config
    from mtnlg.plan import checkpoint_cost, param_counts
    params = param_counts(load_config("tiny", overrides={"layers": a.layers, "hidden": a.hidden, "heads": 8,
                                                         "vocab": a.vocab, "seq": 32}).model)["total_unpadded"]
    big = checkpoint_cost(load_config("mtnlg-530b"), fs_gb_per_s=100)
    out = dict(layout=f"TP{a.tp} x PP{a.pp} x DP{a.dp}", precision=a.precision, params=params, seconds=med,
               raw=rows, bytes=dict(mtnlg=ours, deepspeed=ds),
               ratio=dict(save=med["deepspeed_save"] / med["mtnlg_save"], load=med["deepspeed_load"] / med["mtnlg_load"],
                          bytes=ds[0] / ours[0], busiest_rank_bytes=ds[1] / ours[1]),
               planner_530b=big)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"{out['layout']} {a.precision}, {params / 1e6:.1f}M parameters, median of {a.repeat}:")
    print(f"{'':10} {'save s':>8} {'load s':>8} {'bytes':>12} {'busiest rank':>13}")
    for k in ("mtnlg", "deepspeed"):
        print(f"{k:10} {med[k + '_save']:8.3f} {med[k + '_load']:8.3f} {out['bytes'][k][0]:12,} {out['bytes'][k][1]:13,}")
    print("DeepSpeed / mtnlg: " + ", ".join(f"{k} {v:.2f}x" for k, v in out["ratio"].items()))
    print(f"530B (planner): {big['total_bytes'] / 1e12:.2f} TB stored ({big['deepspeed_format_bytes'] / 1e12:.2f} TB in "
          f"DeepSpeed's format), {big['per_rank_bytes'] / 1e9:.2f} GB per rank, {big['per_host_bytes'] / 1e9:.1f} GB per "
          f"host, {big['write_s']:.0f} s at 100 GB/s")
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
