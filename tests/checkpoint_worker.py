"""Worker launched by tests/test_checkpoint.py under torchrun: sharded checkpoints across layouts in one launch.

The launch's processes are regrouped phase by phase into independent sub-worlds (tests/subworld.py). Each job runs the library's real training path (`mtnlg.train.train`) or a
check, and writes OUT/<job>.json (rank 0) or OUT/<job>.err<rank>.json (any rank that failed):

- train: `train(cfg, run, resume)`; with `copy` the job first copies another job's run folder and points
  `latest` at one of its steps (the resume of a run saved at another layout);
- verify (with train): after `train()` loaded the checkpoint (its `_build` wrapped), before its first step, every
  tensor fragment of master weights and Adam moments this rank holds equals the same rectangle of the
  checkpoint's full tensors, exactly;
- dropout: Megatron's RNG rules at TP2 (hidden-state masks equal on both TP ranks, attention streams differ);
- memory: peak host memory of each rank in every phase (init, save, async save, load, evaluation and generation
  loads, export on rank 0, and a positive control holding one whole tensor), each measured alone (the peak reset)
  in a process of its own, forked from the rank before anything else ran there (`fork`: the launch's first phases),
  the allocator set first so that every freed block >= 64 KiB goes back to the system (a `train()` before would
  have kept freed memory in the heap, where reuse hides from the peak); the child's exit frees all it held (an
  engine is kept alive by its own backward hooks), so the training phases after it run as in a launch of their own;
- relayout: the memory job's checkpoint loaded at another layout: peak memory, bytes read against bytes asked for,
  and the same load through DCP's own reader (the positive control of the bytes read).

Usage: torchrun --nproc-per-node N tests/checkpoint_worker.py PLAN.json OUT_DIR
"""
import json, os, shutil, sys, time, traceback, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch

from mtnlg.config import load_config
from mtnlg.topology import init_distributed, shutdown
from mtnlg.checkpoint import HASHED
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


def verify_loaded(cfg, engine, state, ck, out):
    "Every fragment this rank's engine loaded from checkpoint `ck` equals the same rectangle of its full tensors."
    import torch.distributed.checkpoint as dcp
    from mtnlg.checkpoint import engine_state, ADAM_KEYS, _LoadPlanner
    mine = engine_state(engine, cfg, ("model",) + ADAM_KEYS, saving=False)
    names = sorted({k.split("/", 1)[1] for k in mine})
    full = {}
    for key in ("model",) + ADAM_KEYS:                  # the checkpoint's whole tensors, read on this rank
        sd = {f"{key}/{n}": torch.empty(tuple(mine[f"{key}/{n}"].size())) for n in names}
        dcp.load(sd, checkpoint_id=str(ck), planner=_LoadPlanner(), no_dist=True)
        full.update(sd)
    bad, n = [], 0
    for k, pieces in mine.items():
        for off, size, t in pieces.rects:
            want = full[k][tuple(slice(o, o + s) for o, s in zip(off, size))]
            n += 1
            if not torch.equal(t, want): bad.append(k)
    out.update(verified_pieces=n, verified_bad=bad, loaded_step=state["step"])
    if bad: raise AssertionError(f"rank {os.environ['RANK']}: loaded fragments differ from the checkpoint: {bad[:3]}")


def run_train(job, out):
    "`train()`; with `verify`, the engine it resumes is checked against the checkpoint after the load, before step 1."
    import mtnlg.train as T
    cfg = load_config("tiny", overrides=job["set"])
    build = T._build
    def verified_build(*args):
        plan, train_ds, valid_ds, engine, state, ck = got = build(*args)
        verify_loaded(cfg, engine, state, ck, out)
        return got
    if job.get("verify"): T._build = verified_build       # the training run's own load is the one verified
    try: out.update(state=T.train(cfg, job["run"], resume=job.get("resume", False), progress=False))
    finally: T._build = build


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


def _status(key: str) -> int:
    "A /proc/self/status size (VmRSS, VmHWM) in bytes."
    for line in open("/proc/self/status"):
        if line.startswith(key): return int(line.split()[1]) * 1024


def _bytes_read() -> int:
    "Bytes this process has read through system calls so far."
    return int(next(l for l in open("/proc/self/io") if l.startswith("rchar")).split()[1])


def _reset_allocator():
    "Every block >= 64 KiB its own mapping, returned to the system when freed (the opposite of `cpu_malloc_reuse`)."
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-4, 65536)                   # M_MMAP_MAX: blocks may be mappings again
    libc.mallopt(-3, 64 * 1024)               # M_MMAP_THRESHOLD, fixed: each block >= 64 KiB its own mapping
    libc.mallopt(-1, 64 * 1024)               # M_TRIM_THRESHOLD: the heap's free top is returned too
    libc.malloc_trim(0)
    return libc


def _measure(out, name, fn, libc):
    "Run `fn()`; out[name] = its peak resident bytes above the start, out[name + '_kept'] = still resident after."
    import gc
    gc.collect()
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f: f.write("5")          # the peak starts again at the current size
    base = _status("VmRSS")
    r = fn()
    out[name], out[name + "_kept"] = _status("VmHWM") - base, _status("VmRSS") - base
    return r


def _one_step(engine, cfg, topo):
    t = torch.randint(0, cfg.model.vocab_size, (cfg.optim.global_batch // topo.dp, cfg.model.seq_length + 1),
                      generator=torch.Generator().manual_seed(0))
    engine.train_batch(iter([(m[:, :-1], m[:, 1:]) for m in t.split(cfg.parallel.micro_batch)]))


def _warm_up(run, libc, exports: bool):
    "Import and run once what the phases use, so that no phase counts a library's first load."
    if exports: import transformers, safetensors.torch                    # noqa: F401 (export's, on its one rank)
    from mtnlg.config import ModelConfig, RunConfig
    from mtnlg.model import FullInit
    from mtnlg.checkpoint import write_weights, read_tensors
    small = RunConfig(model=ModelConfig(num_layers=1, hidden_size=16, num_heads=2, seq_length=8, vocab_size=64))
    w = FullInit(small.model, 0)
    ck = write_weights(Path(run) / "warm" / "checkpoints" / "step00000000", small, lambda n: w[n])
    read_tensors(ck, ["blocks.0.mlp.fc1.weight"], small.model)


def _sizes(module) -> dict:
    return dict(shard_bytes=sum(p.numel() * 4 for p in module.parameters()),
                largest_slice_bytes=max(p.numel() * 4 for p in module.parameters()))


def _moments_bytes(engine) -> int:
    from mtnlg.checkpoint import ADAM_KEYS
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    return sum(v.numel() * 4 for s in inner.state.values() for k, v in s.items() if k in ADAM_KEYS)


def _asked_bytes(engine, cfg) -> int:
    "Bytes of every piece this rank loads (master weights and both moments)."
    from mtnlg.checkpoint import engine_state, ADAM_KEYS
    return sum(t.numel() * 4 for p in engine_state(engine, cfg, ("model",) + ADAM_KEYS, saving=False).values()
               for _, _, t in p.rects)


def _files_bytes(ck) -> int:
    "Bytes of every data file of checkpoint `ck` (what one rank hashing them all would read)."
    return sum(f.stat().st_size for f in Path(ck).glob("*.distcp"))


def run_memory(job, out):
    "Per-rank peak host memory of every phase, each measured alone (allocator reset), with each rank's own sizes."
    import dataclasses
    from mtnlg.model import init_parameters, full_shapes
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.checkpoint import (Checkpointer, save_checkpoint, load_checkpoint, load_weights, read_tensors,
                                  engine_state, ADAM_KEYS)
    from mtnlg.generate import Stage
    from mtnlg.export import export_checkpoint, name_groups
    libc = _reset_allocator()
    cfg = load_config("tiny", overrides=job["set"])
    topo = init_distributed(cfg.parallel, timeout_s=300, run_cfg=cfg)
    run = Path(job["run"])
    _warm_up(run / f"warm{topo.rank}", libc, exports=topo.rank == 0)
    measure = lambda name, fn: _measure(out, name, fn, libc)
    module = measure("init", lambda: init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed))
    out.update(_sizes(module))
    engine = build_engine(cfg, topo, module)
    _one_step(engine, cfg, topo)
    state = dict(step=1, consumed_samples=cfg.optim.global_batch, tokens=0, skipped=0)
    ck = measure("save", lambda: save_checkpoint(engine, topo, cfg, run, state))
    frag = engine_state(engine, cfg, ("model",) + ADAM_KEYS, saving=True)
    out["fragment_bytes"] = sum(t.numel() * 4 for p in frag.values() for _, _, t in p.rects)
    frag = None
    saver = Checkpointer(topo, dataclasses.replace(cfg, async_checkpoint=True), run / "async")
    measure("save_async", lambda: (saver.save(engine, dict(state)), saver.wait()))
    engine = module = None                                # free the first engine before the second
    new = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed, zero=True))
    saved = json.loads((ck / "train_state.json").read_text())
    r0, h0 = _bytes_read(), HASHED["bytes"]
    measure("load", lambda: load_checkpoint(new, topo, cfg, ck, saved))
    out.update(load_read_bytes=_bytes_read() - r0, load_asked_bytes=_asked_bytes(new, cfg),
               load_hashed_bytes=HASHED["bytes"] - h0, files_bytes=_files_bytes(ck),
               load_moments_bytes=_moments_bytes(new))
    new = None
    measure("eval_load", lambda: load_weights(build_pipeline(cfg, topo), ck, cfg.model))
    stage = measure("generation_load", lambda: load_weights(Stage(cfg.model, topo.pp, topo.pp_rank), ck,
                                                             cfg.model))
    out["generation_bytes"] = sum(p.numel() * 4 for p in stage.parameters())
    stage = None
    shapes = full_shapes(cfg.model)
    largest = max(shapes, key=lambda n: torch.Size(shapes[n]).numel())
    out["largest_tensor_bytes"] = 4 * torch.Size(shapes[largest]).numel()
    out["full_state_bytes"] = 3 * sum(4 * torch.Size(s).numel() for s in shapes.values())   # weights + 2 moments
    # positive control: the evaluation load, holding one whole tensor as a load that gathers it would
    measure("control", lambda: (load_weights(build_pipeline(cfg, topo), ck, cfg.model),
                                read_tensors(ck, [largest], cfg.model)))
    if topo.rank == 0:
        groups = [sum(4 * torch.Size(shapes[p]).numel() for p, _, _ in g) for g in name_groups(cfg.model)]
        out.update(largest_group_bytes=max(groups), full_weights_bytes=sum(groups))
        measure("export", lambda: export_checkpoint(ck, run / "hf", dtype="bf16"))
    shutdown()


def run_relayout(job, out):
    "Load the memory job's checkpoint at another layout: peak memory, and bytes read against bytes asked for."
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from mtnlg.model import init_parameters, full_shapes
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.checkpoint import load_checkpoint, engine_state, ADAM_KEYS, _LoadPlanner
    from mtnlg.checkpoint_folders import latest_checkpoint
    libc = _reset_allocator()
    cfg = load_config("tiny", overrides=job["set"])
    topo = init_distributed(cfg.parallel, timeout_s=300, run_cfg=cfg)
    ck = latest_checkpoint(job["from"])
    saved = json.loads((ck / "train_state.json").read_text())
    module = init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed, zero=True)
    out.update(_sizes(module))
    out["largest_tensor_bytes"] = max(4 * torch.Size(v).numel() for v in full_shapes(cfg.model).values())
    new = build_engine(cfg, topo, module)
    r0, h0 = _bytes_read(), HASHED["bytes"]
    _measure(out, "load_new_layout", lambda: load_checkpoint(new, topo, cfg, ck, saved), libc)
    out.update(read_bytes=_bytes_read() - r0, asked_bytes=_asked_bytes(new, cfg), hashed_bytes=HASHED["bytes"] - h0,
               files_bytes=_files_bytes(ck),
               moments_bytes=_moments_bytes(new))
    # positive control: the same load through DCP's own reader
    sd = engine_state(new, cfg, ("model",) + ADAM_KEYS, saving=False)
    r0 = _bytes_read()
    _measure(out, "load_stock_reader", lambda: dcp.load(sd, storage_reader=FileSystemReader(ck),
                                                        planner=_LoadPlanner(), no_dist=True), libc)
    out["stock_read_bytes"] = _bytes_read() - r0
    shutdown()


def run_damaged(job, out):
    "`mtnlg eval`'s load at TP2 of a checkpoint with one damaged file: what each rank raises (or that it loaded)."
    from mtnlg import eval as ev
    from mtnlg.config import EvalError
    from mtnlg.results import reusable
    from mtnlg.runs import checkpoint_identity
    try: _, ck = ev.load_model_for_eval(job["run"], 8, tp=2)
    except EvalError as e:
        out["refused"] = str(e)
        return shutdown()
    r0 = _bytes_read()                                 # score reuse's check after the load: what it reads again
    out.update(loaded=True, reusable=reusable(checkpoint_identity(ck, job["run"])))
    out.update(reuse_read_bytes=_bytes_read() - r0, files_bytes=_files_bytes(ck))
    shutdown()


def run_forked(fn, job, out):
    "`fn(job, out)` in a child forked from this rank: a heap nothing has shaped, all it held freed at its exit."
    path = Path(sys.argv[2]) / f"{job['name']}.fork{os.environ['RANK']}"      # its `out` (not *.json: not collected)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn(job, out)
            code = 0
        except BaseException as e:
            out["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        finally:
            try: path.write_text(json.dumps(out))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    got = json.loads(path.read_text()) if path.exists() else {}
    path.unlink(missing_ok=True)
    if "error" in got or code: raise RuntimeError(f"forked {job['kind']} job (exit {code}): {got.get('error')}")
    out.update(got)


def run_job(job, out):
    "One job of the plan in its sub-world (tests/subworld.py); with `fork`, in a child of this rank."
    if int(os.environ["RANK"]) == 0 and job.get("copy"): _copy(job, out)
    kinds = dict(train=run_train, dropout=run_dropout, memory=run_memory, relayout=run_relayout, damaged=run_damaged)
    if job.get("fork"): return run_forked(kinds[job["kind"]], job, out)
    kinds[job["kind"]](job, out)


if __name__ == "__main__":
    sys.exit(run_plan(run_job, ports_per_job=2))
