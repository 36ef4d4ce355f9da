"""Issue 41's ladder in one process on one GPU: the baselines, then this project's engine built once with each switch
of the training step added in turn, compile last; every rung's ms/step, model TFLOP/s and peak memory against the
planner, written to OUT/ladder.md and OUT/ladder.jsonl the moment the rung ends.

Rungs, in this order (each: --warmup untimed steps, then --steps timed ones, CUDA events, median):
  matmul peak        bf16 8192^3 matmuls (gpu_step.matmul_peak)
  hf-eager           Hugging Face GPT2LMHeadModel of the same size, bf16 autocast, fused AdamW, clipping
  mtnlg              this project's engine as `mtnlg train` builds it, every switch off
  +bias_in_gemm, +one_pass_loss, +packed_qkv_grad, +fused_dropout_add, +sync_free_step
                     each switch of `ParallelConfig` added to the rungs before it (`mtnlg.pipeline.set_switches`
                     on the same engine: nothing is rebuilt)
  (profile)          two more steps of the last eager rung by kernel category (GEMM, attention, elementwise,
                     reduction, copy, optimizer, other)
  hf-compile         the Hugging Face model under torch.compile, with a watchdog (--compile-timeout)
  +compile_once      the blocks compiled (compile_once: the attention outside, dynamic=False, one block built and
                     the others from dynamo's cache), with a watchdog; its first step's time is the build time
A rung that would start past --budget seconds is recorded as skipped; a watchdog that fires records the rung as
timed out and ends the process (what finished is already written).
    python benchmarks/gpu_ladder.py --out /tmp/ladder             # gpt3-1.3b, micro-batch 8
    bash benchmarks/gpu_run.sh --ladder --budget 470              # on the lent GPU (README of gpu_run.sh)
CPU smoke test (tiny sizes, wall clock; minutes):
    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python benchmarks/gpu_ladder.py --device cpu --out /tmp/ladder \\
        --layers 2 --hidden 64 --heads 4 --seq 64 --micro-batch 2 --steps 2 --warmup 1 --skip hf-compile
"""
import argparse, dataclasses, datetime, gc, json, os, statistics, sys, threading, time, traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
SWITCHES = ("bias_in_gemm", "one_pass_loss", "packed_qkv_grad", "fused_dropout_add", "sync_free_step")
CATEGORIES = (("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
              ("GEMM", ("gemm", "cutlass", "xmma", "cublas", "nvjet", "addmm", "aten::mm", "matmul")),
              ("optimizer", ("adam", "multi_tensor", "foreach")),
              ("copy", ("copy", "cat", "stack", "memcpy", "memset", "fill")),
              ("reduction", ("reduce", "norm", "softmax", "sum", "max", "cross_entropy")),
              ("elementwise", ("elementwise", "vectorized", "triton", "add", "mul", "gelu", "dropout", "where")))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for ladder.md and ladder.jsonl")
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)    # gpu_run.sh passes it; tokens are random
    ap.add_argument("--preset", default="gpt3-1.3b")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10, help="timed steps a rung (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps a rung first")
    ap.add_argument("--budget", type=float, default=470, help="seconds for the whole ladder (rungs past it: skipped)")
    ap.add_argument("--compile-timeout", type=float, default=150, help="seconds a compiled rung may take in all")
    ap.add_argument("--skip", default="", help="comma-separated rungs to leave out (e.g. hf-compile)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    return ap.parse_args(argv)


class Ladder:
    "The rungs' records: a Markdown row and a JSON line each, flushed to disk as the rung ends."
    def __init__(self, a, flops: float, peak_tflops: float):
        self.out, self.flops, self.peak, self.deadline = Path(a.out), flops, peak_tflops, time.time() + a.budget
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows = []

    def write(self, text: str, record: dict | None = None):
        print(text, flush=True)
        with open(self.out / "ladder.md", "a") as f: f.write(text + "\n")
        if record is not None:
            with open(self.out / "ladder.jsonl", "a") as f: f.write(json.dumps(record) + "\n")

    def rung(self, name: str, times=None, mem=None, planned=None, loss=None, first_s=None, error=None):
        "Record one rung (its step times in seconds, its peak memory in bytes), or its error."
        gib = lambda b: "-" if b is None else f"{b / 2 ** 30:.2f}"
        if error:
            self.write(f"| {name} | {error} | | | | | | |", dict(rung=name, error=error))
            return
        ms = 1e3 * statistics.median(times)
        tf = self.flops / (ms / 1e3) / 1e12
        base = next((r for r in self.rows if r["rung"] == "hf-eager"), None)
        vs = f"{base['ms'] / ms:.3f}x" if base else "-"
        rec = dict(rung=name, ms=ms, tflops=tf, of_peak=tf / self.peak, vs_hf_eager=vs, peak_bytes=mem,
                   planned_bytes=planned, loss=loss, first_step_s=first_s)
        self.rows.append(rec)
        first = "-" if first_s is None else f"{first_s:.1f}"
        self.write(f"| {name} | {ms:.1f} | {tf:.1f} | {tf / self.peak:.1%} | {vs} | {gib(mem)} | {gib(planned)} | "
                   f"{first} |", rec)


def timed(step, make_input, a, dev):
    "(step times in seconds, last loss, first step's seconds, peak bytes) of warm-up + timed steps."
    import torch, gpu_step
    if dev.type == "cuda": torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = step(*make_input())
    if dev.type == "cuda": torch.cuda.synchronize()
    first = time.perf_counter() - t0
    times, out = gpu_step.time_steps(step, make_input, a.steps, max(0, a.warmup - 1))
    mem = torch.cuda.max_memory_allocated() if dev.type == "cuda" else None
    return times, float(out), first, mem


def watchdog(ladder: Ladder, name: str, seconds: float):
    "A timer that records rung `name` as timed out and ends the process (everything before it is written)."
    def fire():
        ladder.rung(name, error=f"timed out after {seconds:.0f} s (watchdog)")
        os._exit(3)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def categories(step, make_input, dev, steps=2) -> dict:
    "Milliseconds a step by kernel category (GPU kernels; on a CPU, aten ops' self time) over `steps` more steps."
    import torch
    from torch.profiler import profile, ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    inputs = [make_input() for _ in range(steps)]
    with profile(activities=acts) as p:
        for x in inputs: step(*x)
        if dev.type == "cuda": torch.cuda.synchronize()
    out = {}
    for e in p.key_averages():
        us = e.self_device_time_total if dev.type == "cuda" else (e.self_cpu_time_total if e.key.startswith("aten::")
                                                                  else 0)
        if not us: continue
        name = e.key.lower()
        cat = next((c for c, keys in CATEGORIES if any(k.lower() in name for k in keys)), "other")
        out[cat] = out.get(cat, 0.0) + us / 1e3 / steps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def packs_qkv_grads(dev) -> bool:
    "Whether SDPA's kernel under `packed_qkv_grad` hands q, k, v's gradients back as one buffer (no copy needed)."
    import torch
    from mtnlg.model import QKVHeads, _packed_base, _packing_kernel
    qkv = torch.randn(2, 128, 3 * 4 * 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    got = []
    class Spy(torch.autograd.Function):                 # records the gradients the attention hands back
        @staticmethod
        def forward(ctx, *t): return tuple(x.view_as(x) for x in t)
        @staticmethod
        def backward(ctx, *g):
            got.extend(g)
            return g
    q, k, v = Spy.apply(*QKVHeads.apply(qkv, 4))
    with _packing_kernel(q, True): o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    o.sum().backward()
    return _packed_base([g.transpose(1, 2) for g in got], (2, 128, 3, 4, 64)) is not None


def free(dev):
    import torch
    gc.collect()
    if dev.type == "cuda": torch.cuda.empty_cache()


def main(argv=None):
    a = parse_args(argv)
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch, gpu_step
    gpu_step.torch = torch                            # gpu_step imports torch in its main(); its helpers need it
    dev = torch.device(a.device)
    skip = set(filter(None, a.skip.split(",")))
    from mtnlg.plan import flops_per_iteration, memory_per_gpu
    cfg = gpu_step.make_config(a)
    m = cfg.model
    n, peak = gpu_step.matmul_peak(dev)
    ladder = Ladder(a, flops_per_iteration(cfg, recompute="none"), peak)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    try: packed = packs_qkv_grads(dev)
    except Exception as e: packed = f"{type(e).__name__}: {e}"[:120]
    ladder.write(f"\n## The step's ladder (`benchmarks/gpu_ladder.py`)\n\nDate "
                 f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; device {name}; torch "
                 f"{torch.__version__}. {a.preset}: {m.num_layers} layers, hidden {m.hidden_size}, seq {m.seq_length}, "
                 f"micro-batch {a.micro_batch}, bf16, dropout {m.hidden_dropout}/{m.attention_dropout}; "
                 f"{a.warmup} warm-up and {a.steps} timed steps a rung (median). Matmul peak ({n}^3): {peak:.1f} "
                 f"TFLOP/s. SDPA under `packed_qkv_grad` hands q/k/v's gradients back packed (no copy): {packed}."
                 f"\n\n| rung | ms/step | model TFLOP/s | of matmul peak | vs HF eager | peak GiB | "
                 f"planner GiB | first step s |\n|---|---:|---:|---:|---:|---:|---:|---:|",
                 dict(rung="header", device=name, torch=torch.__version__, matmul_peak_tflops=peak,
                      qkv_packed=packed))
    batch = lambda: gpu_step.random_batch(cfg, dev)
    def baseline(rung, compile):
        if rung in skip: return
        if time.time() > ladder.deadline: return ladder.rung(rung, error="skipped: --budget spent")
        dog = watchdog(ladder, rung, a.compile_timeout) if compile else None
        try:
            before = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
            times, loss, params = gpu_step.run_hf(cfg, dev, a, compile=compile)
            mem = torch.cuda.max_memory_allocated() - before if dev.type == "cuda" else None
            ladder.rung(rung, times, mem, loss=float(loss))
        except Exception as e:
            traceback.print_exc()
            ladder.rung(rung, error=f"{type(e).__name__}: {e}"[:200])
        finally:
            if dog: dog.cancel()
            free(dev)
    baseline("hf-eager", False)
    from mtnlg.model import compile_blocks, init_parameters
    from mtnlg.pipeline import build_pipeline, build_engine, set_switches
    from mtnlg.topology import init_distributed
    topo = init_distributed(cfg.parallel, run_cfg=cfg)
    engine = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), m, cfg.seed), grad_accum=1)
    step = lambda t, l: engine.train_batch(iter([(t, l)]))
    par = dataclasses.replace(cfg.parallel, **{s: False for s in SWITCHES})   # the base rung: every switch off
    for rung in ("mtnlg",) + tuple(f"+{s}" for s in SWITCHES):
        if rung.lstrip("+") in skip: continue
        if time.time() > ladder.deadline: ladder.rung(rung, error="skipped: --budget spent"); continue
        if rung != "mtnlg": setattr(par, rung[1:], True)
        try:
            set_switches(engine, par)
            times, loss, first, mem = timed(step, batch, a, dev)
            c = dataclasses.replace(cfg, parallel=par)
            ladder.rung(rung, times, mem, memory_per_gpu(c)["peak_bytes"], loss, first)
        except Exception as e:
            traceback.print_exc()
            ladder.rung(rung, error=f"{type(e).__name__}: {e}"[:200])
    if time.time() < ladder.deadline:
        cats = categories(step, batch, dev)
        ladder.write(f"\nProfile of the last eager rung, ms a step by kernel category: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in cats.items()) + "\n", dict(rung="profile", ms=cats))
    baseline("hf-compile", True)
    if "compile" in skip: return 0
    if time.time() > ladder.deadline: return ladder.rung("+compile_once", error="skipped: --budget spent") or 0
    dog = watchdog(ladder, "+compile_once", a.compile_timeout)
    from torch._dynamo.utils import counters
    counters.clear()                                  # the loss and dropout kernels' graphs are not the blocks'
    try:
        par.compile_once = True
        set_switches(engine, par)
        compile_blocks(engine.module, dynamic=False)
        times, loss, first, mem = timed(step, batch, a, dev)
        ladder.rung("+compile_once", times, mem, memory_per_gpu(dataclasses.replace(cfg, parallel=par))["peak_bytes"],
                    loss, first)
        ladder.write(f"\nCompiled: {counters['frames']['total']} frames, {counters['stats']['unique_graphs']} graphs "
                     f"for {m.num_layers} blocks; build {first:.1f} s (the first step).",
                     dict(rung="compile", frames=counters["frames"]["total"],
                          graphs=counters["stats"]["unique_graphs"], first_step_s=first))
    except Exception as e:
        traceback.print_exc()
        ladder.rung("+compile_once", error=f"{type(e).__name__}: {e}"[:200])
    finally: dog.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
