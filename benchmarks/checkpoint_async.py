"""Checkpoint stall, sync against async saves, and the bytes a load at a new layout reads per rank (one run).

Launch 1, TP2 x PP2 x DP2 on 8 CPU processes (bf16, ZeRO-1, fp32 masters): after warm-up steps, `--repeat` rounds
of a window of `--window` training steps, the first of which ends with a save: sync, then async, alternately.
Measured per window (slowest rank, each step timed between barriers): the stall (seconds `save()` held the step
loop), every step's time (with `poll()`, as `mtnlg train` runs it), the step at which the async save was
committed. The headline is what the loop pays for a save: the `save()` call, plus each following step's excess
over a step without a save until the write has ended (the commit; a wait at the window's end counts whole), sync
against async, with the windows' times beside it; "async_even" is async with the writer at training's CPU
priority (the default lowers it once the copy is staged). Launch 2, TP1 x PP2 x DP4: loads launch 1's checkpoint
with mtnlg's reader and then with DCP's own, bytes read per rank (/proc/self/io) against the bytes each rank asks for. Also the planner's 530B figures.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/checkpoint_async.py [--layers 8 --hidden 640 --repeat 3]
"""
import argparse, dataclasses, json, os, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path


MODES = ("sync", "async", "async_even")


def _cfg(a, tp, pp, dp):
    from mtnlg.config import load_config
    return load_config("tiny", overrides={"layers": a.layers, "hidden": a.hidden, "heads": 8, "vocab": a.vocab,
                                          "seq": 32, "micro_batch": 1, "global_batch": 4, "tp": tp, "pp": pp,
                                          "dp": dp, "zero": 1, "precision": "bf16", "data": "mock"})


def _slowest(topo, x: float) -> float:
    import torch, torch.distributed as dist
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _fragment_bytes(engine, topo, cfg) -> int:
    "Bytes this rank writes in a save (its fragment of the masters and both moments)."
    from mtnlg.checkpoint import save_items
    return sum(t.numel() * t.element_size() for *_, t in save_items(engine, topo, cfg, moments=True))


def save_worker(a):
    "Launch 1: sync and async saves of the same training steps; stalls and step times."
    import torch, torch.distributed as dist
    from mtnlg.topology import init_distributed, shutdown, cpu_malloc_reuse
    from mtnlg.model import init_parameters
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.checkpoint import Checkpointer
    cfg = _cfg(a, 2, 2, 2)
    topo = init_distributed(cfg.parallel, timeout_s=600, run_cfg=cfg)
    cpu_malloc_reuse()                                            # as `mtnlg train` runs
    engine = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed))
    data = torch.randint(0, cfg.model.vocab_size, (cfg.optim.global_batch // topo.dp, cfg.model.seq_length + 1),
                         generator=torch.Generator().manual_seed(0))
    step = lambda: engine.train_batch(iter([(m[:, :-1], m[:, 1:]) for m in data.split(1)]))
    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        r = fn()
        return _slowest(topo, time.perf_counter() - t0), r
    for _ in range(3): step()                                     # warm-up
    base = [timed(step)[0] for _ in range(a.window)]
    rounds, n = [], 3 + a.window
    for r in range(a.repeat):
        for mode in MODES:                                        # async_even: the writer at training's priority
            saver = Checkpointer(topo, dataclasses.replace(cfg, async_checkpoint=mode != "sync"),
                                 Path(a.dir) / f"{mode}{r}", writer_nice=0 if mode == "async_even" else 10)
            steps = [timed(step)[0]]
            n += 1
            stall, _ = timed(lambda: saver.save(engine, dict(step=n, consumed_samples=4 * n, tokens=0, skipped=0)))
            committed = 0 if mode == "sync" else None
            for i in range(1, a.window):
                dt, done = timed(lambda: (step(), saver.poll())[1])
                steps.append(dt)
                n += 1
                if done is not None and committed is None: committed = i
            drain, _ = timed(saver.wait)                          # a save still in flight at the window's end
            rounds.append(dict(mode=mode, stall_s=stall, step_s=steps, committed_after_steps=committed,
                               drain_s=drain, window_s=sum(steps) + stall + drain, waited_s=saver.waited_s,
                               bytes_per_rank=_slowest(topo, float(_fragment_bytes(engine, topo, cfg)))))
    if topo.rank == 0: Path(a.result).write_text(json.dumps(dict(base_step_s=base, rounds=rounds)))
    shutdown()


def load_worker(a):
    "Launch 2: launch 1's checkpoint loaded at TP1 x PP2 x DP4 by mtnlg's reader and DCP's; bytes per rank."
    import torch, torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from mtnlg.topology import init_distributed, shutdown
    from mtnlg.model import init_parameters
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.checkpoint import load_checkpoint, engine_state, ADAM_KEYS, _LoadPlanner
    from mtnlg.checkpoint_folders import latest_checkpoint
    cfg = _cfg(a, 1, 2, 4)
    topo = init_distributed(cfg.parallel, timeout_s=600, run_cfg=cfg)
    engine = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed, zero=True))
    ck = latest_checkpoint(Path(a.dir) / "sync0")
    state = json.loads((ck / "train_state.json").read_text())
    rchar = lambda: int(next(l for l in open("/proc/self/io") if l.startswith("rchar")).split()[1])
    dist.barrier()
    r0, t0 = rchar(), time.perf_counter()
    load_checkpoint(engine, topo, cfg, ck, state)
    ours_s, ours = time.perf_counter() - t0, rchar() - r0
    sd = engine_state(engine, cfg, ("model",) + ADAM_KEYS, saving=False)
    asked = sum(t.numel() * t.element_size() for p in sd.values() for _, _, t in p.rects)
    dist.barrier()
    r0, t0 = rchar(), time.perf_counter()
    dcp.load(sd, storage_reader=FileSystemReader(ck), planner=_LoadPlanner(), no_dist=True)
    stock_s, stock = time.perf_counter() - t0, rchar() - r0
    rows = [None] * topo.world_size if topo.rank == 0 else None
    dist.gather_object(dict(rank=topo.rank, asked=asked, read=ours, stock_read=stock), rows, dst=0)
    seconds = dict(ours=_slowest(topo, ours_s), stock=_slowest(topo, stock_s))
    if topo.rank == 0: Path(a.result).write_text(json.dumps(dict(ranks=rows, seconds=seconds)))
    shutdown()


def _launch(a, role, result):
    args = [f"--{k}={v}" for k, v in vars(a).items() if k in ("layers", "hidden", "vocab", "repeat", "window")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "8", "--master-port", str(a.port),
           __file__, f"--{role}", "--dir", a.dir, "--result", str(result), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(Path(result).read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=640)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--port", type=int, default=29631)
    ap.add_argument("--out", default="benchmarks/checkpoint_async_paid.json")
    ap.add_argument("--save-worker", action="store_true")
    ap.add_argument("--load-worker", action="store_true")
    ap.add_argument("--dir")
    ap.add_argument("--result")
    a = ap.parse_args()
    if a.save_worker: return save_worker(a)
    if a.load_worker: return load_worker(a)
    a.dir = tempfile.mkdtemp(prefix="mtnlg-ckasync-")
    saves = _launch(a, "save-worker", Path(a.dir) / "saves.json")
    loads = _launch(a, "load-worker", Path(a.dir) / "loads.json")
    med = lambda mode, k: statistics.median(r[k] for r in saves["rounds"] if r["mode"] == mode)
    base = statistics.median(saves["base_step_s"])
    during = statistics.median(s for r in saves["rounds"] if r["mode"] == "async" for s in r["step_s"][1:])
    summary = dict(stall_s={m: med(m, "stall_s") for m in MODES},
                   window_s={m: med(m, "window_s") for m in MODES}, base_step_s=base,
                   async_step_s_while_writing=during,
                   async_committed_after_steps=[r["committed_after_steps"] for r in saves["rounds"]
                                                if r["mode"] == "async"])
    def paid(r) -> float:
        "save() + each later step's excess over `base` until the write ended + a wait at the window's end."
        end = len(r["step_s"]) - 1 if r["committed_after_steps"] is None else r["committed_after_steps"]
        return r["stall_s"] + sum(s - base for s in r["step_s"][1:end + 1]) + r["drain_s"]
    for r in saves["rounds"]: r["paid_s"] = paid(r)
    summary["paid_s"] = {m: med(m, "paid_s") for m in MODES}
    summary["paid_ratio_async_over_sync"] = summary["paid_s"]["async"] / summary["paid_s"]["sync"]
    summary["paid_ratio_async_even_over_sync"] = summary["paid_s"]["async_even"] / summary["paid_s"]["sync"]
    summary["stall_ratio_async_over_sync"] = summary["stall_s"]["async"] / summary["stall_s"]["sync"]
    summary["async_stall_over_step"] = summary["stall_s"]["async"] / base
    summary["bytes_per_rank"] = max(r["bytes_per_rank"] for r in saves["rounds"])
    summary["window_ratio_async_over_sync"] = summary["window_s"]["async"] / summary["window_s"]["sync"]
    summary["step_while_writing_over_base"] = during / base
    ranks = loads["ranks"]
    summary["load_new_layout"] = dict(
        asked_bytes=[r["asked"] for r in ranks], read_bytes=[r["read"] for r in ranks],
        stock_read_bytes=[r["stock_read"] for r in ranks],
        max_read_over_asked=max(r["read"] / r["asked"] for r in ranks),
        max_stock_read_over_asked=max(r["stock_read"] / r["asked"] for r in ranks), seconds=loads["seconds"])
    from mtnlg.config import load_config
    from mtnlg.plan import checkpoint_cost, param_counts
    big = checkpoint_cost(load_config("mtnlg-530b"), fs_gb_per_s=100)
    summary["planner_530b"] = {k: big[k] for k in ("write_s", "lost_per_save_sync_s", "lost_per_save_async_s",
                                                   "async_host_bytes", "per_rank_bytes")}
    params = param_counts(_cfg(a, 1, 1, 1).model)["total_unpadded"]
    out = dict(layout="TP2 x PP2 x DP2 -> TP1 x PP2 x DP4", precision="bf16", params=params, window=a.window,
               repeat=a.repeat, summary=summary, saves=saves, loads=loads)
    Path(a.out).write_text(json.dumps(out, indent=1))
    s, l = summary, summary["load_new_layout"]
    print(f"{params / 1e6:.1f}M parameters, TP2 x PP2 x DP2 bf16, median of {a.repeat} windows of {a.window} steps:")
    print(f"  paid by the loop: sync {s['paid_s']['sync']:.3f} s, async {s['paid_s']['async']:.3f} s (writer at "
          f"lower priority), async {s['paid_s']['async_even']:.3f} s (at training's); async/sync "
          f"{s['paid_ratio_async_over_sync']:.2f} and {s['paid_ratio_async_even_over_sync']:.2f} (save() + the "
          "following steps' excess over a step without a save until the write ends)")
    print(f"  window          sync {s['window_s']['sync']:.3f} s   async {s['window_s']['async']:.3f} s   "
          f"async at training's priority {s['window_s']['async_even']:.3f} s (async/sync "
          f"{s['window_ratio_async_over_sync']:.2f})")
    print(f"  save stall      sync {s['stall_s']['sync']:.3f} s   async {s['stall_s']['async']:.3f} s   "
          f"(async/sync {s['stall_ratio_async_over_sync']:.3f}; {s['async_stall_over_step']:.3f} of a step); "
          f"{s['bytes_per_rank'] / 2 ** 20:.0f} MiB written per rank")
    print(f"  step            alone {base:.3f} s   while an async save writes {during:.3f} s "
          f"({s['step_while_writing_over_base']:.2f}x); committed after {s['async_committed_after_steps']} steps")
    print(f"  load at TP1 x PP2 x DP4: read/asked per rank max {l['max_read_over_asked']:.3f} (mtnlg), "
          f"{l['max_stock_read_over_asked']:.3f} (DCP's reader); {l['seconds']}")
    print(f"530B (planner, 100 GB/s): a save stops training {big['lost_per_save_sync_s']:.1f} s sync, "
          f"{big['lost_per_save_async_s']:.2f} s async ({big['async_host_bytes'] / 1e9:.1f} GB host memory a node)")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
