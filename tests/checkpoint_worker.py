"""Worker launched by tests/test_checkpoint.py under torchrun: sharded checkpoints across layouts in one launch.

The launch's processes are regrouped phase by phase into independent sub-worlds (tests/subworld.py). Each job runs the library's real training path (`mtnlg.train.train`) or a
check, and writes OUT/<job>.json (rank 0) or OUT/<job>.err<rank>.json (any rank that failed):

- train: `train(cfg, run, resume)`; with `copy` the job first copies another job's run folder and points
  `latest` at one of its steps (the resume of a run saved at another layout);
- verify (with train): after loading, every tensor fragment of master weights and Adam moments this rank holds
  equals the same rectangle of the checkpoint's full tensors, exactly;
- dropout: Megatron's RNG rules at TP2 (hidden-state masks equal on both TP ranks, attention streams differ);
- memory: peak host memory of each rank during init, save, load, evaluation load and export.

Usage: torchrun --nproc-per-node N tests/checkpoint_worker.py PLAN.json OUT_DIR
"""
import json, os, shutil, sys, time, traceback, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch

from mtnlg.config import load_config
from mtnlg.topology import init_distributed, shutdown
from subworld import run_plan


def _copy(job, out):
    "Rank 0 of the job: RUN <- copy of another job's run, `latest` at the given step (as a restore would leave it)."
    src, step = job["copy"]
    run = Path(job["run"])
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(src, run)
    (run / "checkpoints" / "latest").write_text(f"step{step:08d}")
    for d in (run / "checkpoints").glob("step*"):
        if int(d.name[4:]) > step: shutil.rmtree(d)


def verify_loaded(cfg, run, out):
    "Load the run's latest checkpoint at this layout; compare every fragment with the checkpoint's full tensors."
    from mtnlg.train import _build
    from mtnlg.checkpoint import engine_state, ADAM_KEYS
    topo = init_distributed(cfg.parallel, timeout_s=120, run_cfg=cfg)
    *_, engine, state, ck = _build(cfg, Path(run), True, topo)
    mine = engine_state(engine, cfg, ("model",) + ADAM_KEYS, saving=False)
    names = sorted({k.split("/", 1)[1] for k in mine})
    full = {}
    for key in ("model",) + ADAM_KEYS:                  # the checkpoint's whole tensors, read on this rank
        sd = {f"{key}/{n}": torch.empty(tuple(mine[f"{key}/{n}"].size())) for n in names}
        import torch.distributed.checkpoint as dcp
        from mtnlg.checkpoint import _LoadPlanner
        dcp.load(sd, checkpoint_id=str(ck), planner=_LoadPlanner(), no_dist=True)
        full.update(sd)
    bad, n = [], 0
    for k, pieces in mine.items():
        for off, size, t in pieces.rects:
            want = full[k][tuple(slice(o, o + s) for o, s in zip(off, size))]
            n += 1
            if not torch.equal(t, want): bad.append(k)
    out.update(verified_pieces=n, verified_bad=bad, loaded_step=state["step"])
    if bad: raise AssertionError(f"rank {topo.rank}: loaded fragments differ from the checkpoint: {bad[:3]}")
    shutdown()


def run_train(job, out):
    from mtnlg.train import train
    cfg = load_config("tiny", overrides=job["set"])
    if job.get("verify"):
        verify_loaded(cfg, job["run"], out)
        os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)   # a fresh port for the second group
    state = train(cfg, job["run"], resume=job.get("resume", False), progress=False)
    out.update(state=state)


def run_dropout(job, out):
    "TP2 with dropout: hidden-state masks identical on both TP ranks, attention dropout streams differ."
    import torch.distributed as dist
    from megatron.core import tensor_parallel, parallel_state as ps
    from mtnlg.model import GPT, init_parameters
    from mtnlg.topology import seed_all
    cfg = load_config("tiny", overrides=job["set"])
    topo = init_distributed(cfg.parallel, timeout_s=120, run_cfg=cfg)
    seed_all(cfg.seed, topo)
    model = init_parameters(GPT(cfg.model), cfg.model, cfg.seed).train()
    masks = []
    hook = lambda m, i, o: masks.append(((o == 0) & (i[0] != 0)).flatten().float())
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout): m.register_forward_hook(hook)
    x = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length), generator=torch.Generator().manual_seed(0))
    model.loss(x, x)
    with tensor_parallel.get_cuda_rng_tracker().fork(): inside = torch.rand(64)   # what SDPA's dropout draws from
    outside = torch.rand(64)
    group = ps.get_tensor_model_parallel_group()
    def differs(t):
        parts = [torch.empty_like(t) for _ in range(topo.tp)]
        dist.all_gather(parts, t.contiguous(), group=group)
        return not torch.equal(parts[0], parts[1])
    hidden = torch.cat(masks)
    out.update(hidden_masks_differ=differs(hidden), hidden_drop_fraction=hidden.mean().item(),
               attention_streams_differ=differs(inside), default_streams_differ=differs(outside))
    shutdown()


def _rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"): return int(line.split()[1]) * 1024


def _peak_since_reset():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"): return int(line.split()[1]) * 1024


def _measure(fn):
    "(result, peak bytes above the resident size at the start) of `fn()`."
    import gc
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f: f.write("5")          # reset the peak to the current size
    base = _rss()
    r = fn()
    return r, _peak_since_reset() - base


def run_memory(job, out):
    "Per-rank peak host memory of init, save, load, eval load and export, with each rank's own sizes."
    from mtnlg.model import init_parameters, full_shapes
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.checkpoint import save_checkpoint, load_checkpoint, load_weights, engine_state, ADAM_KEYS
    from mtnlg.export import export_checkpoint
    cfg = load_config("tiny", overrides=job["set"])
    topo = init_distributed(cfg.parallel, timeout_s=300, run_cfg=cfg)
    run = Path(job["run"])
    module, out["init"] = _measure(lambda: init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed))
    engine = build_engine(cfg, topo, module)
    t = torch.randint(0, cfg.model.vocab_size, (cfg.optim.global_batch // topo.dp, cfg.model.seq_length + 1))
    engine.train_batch(iter([(m[:, :-1], m[:, 1:]) for m in t.split(cfg.parallel.micro_batch)]))
    state = dict(step=1, consumed_samples=cfg.optim.global_batch, tokens=0, skipped=0)
    ck, out["save"] = _measure(lambda: save_checkpoint(engine, topo, cfg, run, state))
    frag = engine_state(engine, cfg, ("model",) + ADAM_KEYS, saving=True)
    out["fragment_bytes"] = sum(t.numel() * 4 for p in frag.values() for _, _, t in p.rects)
    out["shard_bytes"] = sum(p.numel() * 4 for p in engine.module.parameters())
    engine = module = None                                # free the first engine before the second
    new = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed, zero=True))
    _, out["load"] = _measure(lambda: load_checkpoint(new, topo, cfg, ck, dict(state, layout=None)))
    new = None
    _, out["eval_load"] = _measure(lambda: load_weights(build_pipeline(cfg, topo), ck, cfg.model))
    shapes = full_shapes(cfg.model)
    out["largest_tensor_bytes"] = max(4 * torch.Size(s).numel() for s in shapes.values())
    blocks = [sum(4 * torch.Size(s).numel() for n, s in shapes.items() if n.startswith(p))
              for p in ["embedding."] + [f"blocks.{i}." for i in range(cfg.model.num_layers)]]
    out["largest_block_bytes"] = max(blocks)
    out["full_state_bytes"] = 3 * sum(4 * torch.Size(s).numel() for s in shapes.values())  # weights + 2 moments
    if topo.rank == 0: _, out["export"] = _measure(lambda: export_checkpoint(ck, run / "hf", dtype="bf16"))
    shutdown()


def run_job(job, out):
    "One job of the plan in its sub-world (tests/subworld.py)."
    if int(os.environ["RANK"]) == 0 and job.get("copy"): _copy(job, out)
    {"train": run_train, "dropout": run_dropout, "memory": run_memory}[job["kind"]](job, out)


if __name__ == "__main__":
    sys.exit(run_plan(run_job, ports_per_job=2))
