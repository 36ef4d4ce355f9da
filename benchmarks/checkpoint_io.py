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

    def io():
        "(bytes this process has written, read) through system calls so far."
        d = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
        return int(d["wchar"]), int(d["rchar"])

    def timed(name, fn):
        dist.barrier()
        (w0, r0), t0 = io(), time.perf_counter()
        fn()
        dt, (w1, r1) = time.perf_counter() - t0, io()
        b = (w1 - w0) if name.endswith("save") else (r1 - r0)
        t = torch.tensor([dt, float(b), float(b)], dtype=torch.float64)
        mx, tot = t.clone(), t.clone()
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)                    # the step waits for the slowest rank
        dist.all_reduce(tot)
        io_bytes.setdefault(name, (int(tot[1].item()), int(mx[2].item())))
        return mx[0].item()
    io_bytes = {}
    rows = {k: [] for k in ("mtnlg_save", "mtnlg_load", "deepspeed_save", "deepspeed_load")}
    for i in range(a.repeat):
        ours, ds = root / f"ours{i}", root / f"ds{i}"
        ck = []
        rows["mtnlg_save"].append(timed("mtnlg_save", lambda: ck.append(save_checkpoint(engine, topo, cfg, ours, state))))
        rows["deepspeed_save"].append(timed("deepspeed_save", lambda: engine.save_checkpoint(str(ds), tag="t", save_latest=False)))
        rows["mtnlg_load"].append(timed("mtnlg_load", lambda: load_checkpoint(engine, topo, cfg, ck[0], dict(state, layout=None))))
        rows["deepspeed_load"].append(timed("deepspeed_load", lambda: engine.load_checkpoint(str(ds), tag="t",
                                                                           load_lr_scheduler_states=False)))
    if topo.rank == 0: Path(a.result).write_text(json.dumps(dict(seconds=rows, io=io_bytes)))
    shutdown()


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
    got = json.loads((d / "r.json").read_text())
    rows, io = got["seconds"], got["io"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    on_disk = {k: sum(f.stat().st_size for f in (d / f).rglob("*") if f.is_file()) for k, f in
               (("mtnlg", "ours0/checkpoints"), ("deepspeed", "ds0"))}
    from mtnlg.config import load_config
    from mtnlg.plan import checkpoint_cost, param_counts
    params = param_counts(load_config("tiny", overrides={"layers": a.layers, "hidden": a.hidden, "heads": 8,
                                                         "vocab": a.vocab, "seq": 32}).model)["total_unpadded"]
    big = checkpoint_cost(load_config("mtnlg-530b"), fs_gb_per_s=100)
    out = dict(layout=f"TP{a.tp} x PP{a.pp} x DP{a.dp}", precision=a.precision, params=params, seconds=med,
               raw=rows, on_disk=on_disk, io=io,
               ratio=dict(save=med["deepspeed_save"] / med["mtnlg_save"], load=med["deepspeed_load"] / med["mtnlg_load"],
                          bytes_on_disk=on_disk["deepspeed"] / on_disk["mtnlg"],
                          busiest_rank_write=io["deepspeed_save"][1] / io["mtnlg_save"][1],
                          busiest_rank_read=io["deepspeed_load"][1] / io["mtnlg_load"][1]),
               planner_530b=big)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"{out['layout']} {a.precision}, {params / 1e6:.1f}M parameters, median of {a.repeat}:")
    print(f"{'':10} {'save s':>8} {'load s':>8} {'on disk':>12} {'rank writes':>12} {'rank reads':>12} (busiest rank)")
    for k in ("mtnlg", "deepspeed"):
        print(f"{k:10} {med[k + '_save']:8.3f} {med[k + '_load']:8.3f} {on_disk[k]:12,} {io[k + '_save'][1]:12,} "
              f"{io[k + '_load'][1]:12,}")
    print("DeepSpeed / mtnlg: " + ", ".join(f"{k} {v:.2f}x" for k, v in out["ratio"].items()))
    print(f"530B (planner): {big['total_bytes'] / 1e12:.2f} TB stored ({big['deepspeed_format_bytes'] / 1e12:.2f} TB in "
          f"DeepSpeed's format), {big['per_rank_bytes'] / 1e9:.2f} GB per rank, {big['per_host_bytes'] / 1e9:.1f} GB per "
          f"host, {big['write_s']:.0f} s at 100 GB/s")
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
