"""Time one training step of this project's engine against standard baselines of the same model, in one run.

Rows (all on one GPU, same config, same micro-batch, bf16):
  mtnlg       this project's step as users run it: `mtnlg.model` + `mtnlg.pipeline.build_pipeline` (megatron-core
              TP layers inside a DeepSpeed PipelineModule, TP=PP=DP=1) + `build_engine` (DeepSpeed bf16 weights with
              fp32 master weights, ZeRO stage 1, AdamW, clipping) and `engine.train_batch`;
  mtnlg-ds    the same with DeepSpeed's own bf16 gradient path (`mtnlg.patches.lean_bf16_grads` undone: a cast
              copy and an add per gradient tensor, a flatten and copy back around the all-reduce): its control;
  hf-eager    Hugging Face `GPT2LMHeadModel` of the same size (fp32 weights, bf16 autocast, SDPA attention, fused
              torch AdamW, clipping);
  hf-compile  the same, with `torch.compile(model)`;
  megatron    megatron-core `GPTModel` with its local layer spec (no Transformer Engine), torch AdamW, bf16 autocast.
Dropout, vocabulary padding (to a multiple of 128), tied embeddings, learned positions and GELU are the preset's in
every row. Each row runs in a process of its own (`--in-process`: all in this one): DeepSpeed's engine stays alive
through its autograd hooks after its row, with its GPU memory. Each row: `--warmup` untimed steps, then `--steps`
timed steps (CUDA events; median reported), fresh random tokens every step; `torch.cuda.reset_peak_memory_stats`
before building the model, `max_memory_allocated` after the timed steps. Model FLOPs per step come from
`mtnlg.plan.flops_per_iteration` (Narayanan et al. 2021, three passes, no recompute: 72 B s L h^2 (1 + s/(6h)) + 6 B
s h V with V the padded vocabulary), which every row shares. The bf16 peak is the median time of 8192^3 bf16 matmuls
in the same run; each row is also given as a fraction of it. The project's row also shows the planner's predicted
peak (`mtnlg.plan.memory_per_gpu(cfg)["peak_bytes"]`).

Run on a GPU machine (deepspeed and megatron-core installed; transformers for the HF rows):
    pip install --no-deps deepspeed==0.19.8 megatron-core==0.16.1 && pip install -e .
    python benchmarks/gpu_step.py                       # gpt3-1.3b, micro-batch 4, seq 2048, all rows
    python benchmarks/gpu_step.py --only mtnlg,megatron --micro-batch 8
    python benchmarks/gpu_step.py --only mtnlg,mtnlg+compile --profile   # variants: +FIELD=VALUE config overrides
CPU smoke test (tiny model, wall-clock timing, no torch.compile unless --only names hf-compile):
    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu python benchmarks/gpu_step.py --device cpu --layers 2 --hidden 64 --heads 4 \\
        --seq 64 --micro-batch 2 --steps 3 --warmup 1
The Markdown table it prints (with date, device and versions) belongs in benchmarks/RESULTS.md. A row that fails
(missing package, out of memory) is printed with its error and the others still run; the exit status is then 1.
"""
import argparse, datetime, gc, json, logging, os, platform, statistics, subprocess, sys, tempfile, time, traceback
from pathlib import Path
from importlib import metadata

ROWS = ("mtnlg", "mtnlg-ds", "hf-eager", "hf-compile", "megatron")
torch = None  # imported in main(), after --device cpu has hidden the GPUs


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="gpt3-1.3b", help="mtnlg.config preset (default gpt3-1.3b)")
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    ap.add_argument("--layers", type=int, default=None); ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per row (median reported; default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per row first (default 5)")
    ap.add_argument("--only", default=None, help=f"comma-separated rows of {','.join(ROWS)} (default: all; on CPU "
                    "all but hf-compile); an mtnlg row takes config overrides: mtnlg+compile+parallel.micro_batch=8")
    ap.add_argument("--profile", action="store_true", help="after timing each mtnlg row, profile 3 more steps and print "
                    "the top kernels and host-side ops (torch.profiler)")
    ap.add_argument("--megatron-recompute", choices=("none", "selective"), default="none",
                    help="megatron row: 'selective' recomputes its materialized s x s attention in backward (Megatron's "
                         "memory saver; not counted in model FLOPs) when it does not fit otherwise")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke test with wall-clock timing")
    ap.add_argument("--in-process", action="store_true", help="run every row in this process (default: each row in "
                    "its own, as DeepSpeed's engine stays alive through its autograd hooks: 23.7 GiB at 1.3B, H200)")
    ap.add_argument("--row-json", default=None, help=argparse.SUPPRESS)   # a row's child process: its result here
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 0: ap.error("--steps must be >= 1 and --warmup >= 0")
    rows = a.only.split(",") if a.only else [r for r in ROWS if a.device == "cuda" or r != "hf-compile"]
    bad = [r for r in rows if r.split("+")[0] not in ROWS or ("+" in r and not r.startswith("mtnlg+"))]
    if bad: ap.error(f"--only: unknown rows {bad}; choose from {','.join(ROWS)}")
    a.rows = rows
    return a


def variant(row):
    "Config overrides of an `mtnlg+k=v+flag` row name: {'compile': 'true', 'parallel.micro_batch': '8'}."
    return dict((kv.split("=", 1) if "=" in kv else (kv, "true")) for kv in row.split("+")[1:])


def make_config(a, extra=None):
    "The preset with the flags (and a row's `extra` overrides) applied: 1 GPU, bf16, no activation checkpointing, one micro-batch per step."
    from mtnlg.config import load_config
    ov = {"parallel.micro_batch": a.micro_batch, "optim.global_batch": a.micro_batch, "optim.rampup_batch_start": 0,
          "optim.rampup_batch_increment": 0, "optim.rampup_tokens": 0, "parallel.tp": 1, "parallel.pp": 1,
          "parallel.dp": 1, "parallel.checkpoint_activations": 0, "precision": "bf16"}
    for k, v in (("model.seq_length", a.seq), ("model.num_layers", a.layers), ("model.hidden_size", a.hidden),
                 ("model.num_heads", a.heads)):
        if v is not None: ov[k] = v
    ov.update(extra or {})
    ov["optim.global_batch"] = ov["parallel.micro_batch"]    # one micro-batch per step, also in a row that changes it
    return load_config(a.preset, overrides=ov)


def sync():
    if torch.cuda.is_available(): torch.cuda.synchronize()


def time_steps(step, make_input, steps, warmup):
    "Seconds of each of `steps` calls `step(*make_input())` after `warmup` untimed ones, and the last result."
    for _ in range(warmup): out = step(*make_input())
    sync()
    if torch.cuda.is_available():                     # CUDA events: GPU time between the step's first and last kernel
        ev, out = [], None
        for _ in range(steps):
            x = make_input()                          # outside the timed region
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); out = step(*x); e.record(); ev.append((s, e))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in ev], out
    times = []
    for _ in range(steps):
        x = make_input()
        t0 = time.perf_counter(); out = step(*x); times.append(time.perf_counter() - t0)
    return times, out


def matmul_peak(dev):
    "Matmul TFLOP/s (bf16 8192^3 on GPU; fp32 512^3 on CPU, where bf16 may have no native kernel): median over timed matmuls."
    n, reps = (8192, 50) if dev.type == "cuda" else (512, 5)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    times, _ = time_steps(lambda: a @ b, lambda: (), reps, 5)
    return n, 2 * n ** 3 / statistics.median(times) / 1e12


def n_params(model):
    "Parameters of `model`, each storage counted once (tied embeddings once)."
    return sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())


def random_batch(cfg, dev):
    "Fresh random (tokens, labels) [B, S] on `dev`: labels are the tokens shifted by one."
    m, B = cfg.model, cfg.parallel.micro_batch
    x = torch.randint(0, m.vocab_size, (B, m.seq_length + 1), device=dev)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()



def torch_step(model_loss, model, opt, cfg, dev, autocast_backward=False):
    "A bf16-autocast training step of `model_loss(tokens, labels) -> loss`, with the preset's gradient clipping."
    params = [p for p in model.parameters() if p.requires_grad]
    def step(tokens, labels):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model_loss(tokens, labels)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast_backward):
            loss.backward()
        if cfg.optim.grad_clip: torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
        opt.step(); opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def run_mtnlg(cfg, dev, a, deepspeed_grads=False):
    "This project's engine, exactly as mtnlg.train builds it (1 process: TP=PP=DP=1); or with DeepSpeed's grad path."
    from mtnlg import patches
    from mtnlg.topology import init_distributed, shutdown
    from mtnlg.model import init_parameters
    from mtnlg.pipeline import build_pipeline, build_engine
    topo = init_distributed(cfg.parallel, run_cfg=cfg)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    try:
        module = init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed)
        engine = build_engine(cfg, topo, module, grad_accum=1)
        if deepspeed_grads: patches.lean_bf16_grads(engine, on=False)
        step = lambda t, l: engine.train_batch(iter([(t, l)]))
        out = time_steps(step, lambda: random_batch(cfg, dev), a.steps, a.warmup) + (n_params(module),)
        if a.profile: profile(step, lambda: random_batch(cfg, dev), dev)
        return out
    finally: shutdown()                               # the megatron row sets up its own groups


def profile(step, make_input, dev, steps=3):
    "Print where `steps` more steps spend their time: top kernels (GPU) and top host-side ops."
    from torch.profiler import profile as prof, ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    inputs = [make_input() for _ in range(steps)]
    sync()
    with prof(activities=acts) as p:
        for x in inputs: step(*x)
        sync()
    ka = p.key_averages()
    if dev.type == "cuda":
        print(f"[profile] top kernels by GPU time over {steps} steps:")
        print(ka.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))
    print(f"[profile] top host-side ops by CPU time over {steps} steps:")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70))


def run_hf(cfg, dev, a, compile=False):
    "Hugging Face GPT-2 of the same size: fp32 weights, bf16 autocast, SDPA attention, fused AdamW."
    try: from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError: raise RuntimeError("transformers not installed") from None
    m = cfg.model
    hc = GPT2Config(vocab_size=m.padded_vocab_size(1), n_positions=m.seq_length, n_embd=m.hidden_size,
                    n_layer=m.num_layers, n_head=m.num_heads, n_inner=m.ffn_hidden_size, activation_function="gelu",
                    resid_pdrop=m.hidden_dropout, embd_pdrop=m.hidden_dropout, attn_pdrop=m.attention_dropout,
                    layer_norm_epsilon=m.layernorm_eps, initializer_range=m.init_std, use_cache=False)
    hc._attn_implementation = "sdpa"
    with torch.device(dev): model = GPT2LMHeadModel(hc).train()
    fwd = torch.compile(model) if compile else model
    V = hc.vocab_size
    def loss(tokens, labels):
        logits = fwd(input_ids=tokens).logits
        return torch.nn.functional.cross_entropy(logits.float().view(-1, V), labels.view(-1))
    from mtnlg.pipeline import adamw                  # the project's fused AdamW and parameter groups
    step = torch_step(loss, model, adamw(model, cfg), cfg, dev)
    try: return time_steps(step, lambda: random_batch(cfg, dev), a.steps, a.warmup) + (n_params(model),)
    finally:
        if compile: torch._dynamo.reset()             # compiled code caches would keep the model alive


def run_megatron(cfg, dev, a):
    "megatron-core GPTModel (local layer spec: megatron's own linear/attention/LayerNorm modules), torch AdamW."
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from mtnlg.config import ParallelConfig
    from mtnlg.topology import init_distributed, seed_all, shutdown
    topo = init_distributed(ParallelConfig())         # 1-process group + megatron parallel_state (+ CPU patches)
    try:
        seed_all(cfg.seed, topo)                      # megatron's model-parallel RNG tracker (dropout)
        m = cfg.model
        tc = TransformerConfig(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_heads,
                               ffn_hidden_size=m.ffn_hidden_size, hidden_dropout=m.hidden_dropout,
                               attention_dropout=m.attention_dropout, layernorm_epsilon=m.layernorm_eps,
                               init_method_std=m.init_std, use_cpu_initialization=dev.type == "cpu",
                               params_dtype=torch.float32, gradient_accumulation_fusion=False,
                               recompute_granularity=None if a.megatron_recompute == "none" else "selective")
        model = GPTModel(tc, get_gpt_layer_local_spec(), vocab_size=m.padded_vocab_size(1),
                         max_sequence_length=m.seq_length, share_embeddings_and_output_weights=True,
                         position_embedding_type="learned_absolute").to(dev).train()
        S = m.seq_length
        pos = torch.arange(S, device=dev)[None].expand(cfg.parallel.micro_batch, -1)
        mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool, device=dev), diagonal=1)   # True: masked out
        loss = lambda tokens, labels: model(tokens, pos, mask, labels=labels).mean()   # per-token fp32 CE
        # megatron's linear layers re-enter *CUDA* autocast in backward (torch.amp.custom_bwd(device_type="cuda"));
        # on CPU the same has to be done by hand, or their backward matmuls mix bf16 and fp32
        from mtnlg.pipeline import adamw
        step = torch_step(loss, model, adamw(model, cfg), cfg, dev, autocast_backward=dev.type == "cpu")
        return time_steps(step, lambda: random_batch(cfg, dev), a.steps, a.warmup) + (n_params(model),)
    finally: shutdown()


def run_row(name, cfg, dev, a):
    "Build, time and free one row (`cfg`: its config); a failure becomes the row's error text."
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()              # not 0 only if an earlier row leaked
        if base > 2 ** 28: print(f"[{name}] note: {base / 2 ** 30:.2f} GiB left allocated by earlier rows (subtracted)")
    fn = dict(mtnlg=run_mtnlg, **{name: run_mtnlg} if name.startswith("mtnlg+") else {}, megatron=run_megatron, **{"hf-eager": run_hf,
              "mtnlg-ds": lambda c, d, a: run_mtnlg(c, d, a, deepspeed_grads=True),
              "hf-compile": lambda c, d, a: run_hf(c, d, a, compile=True)})[name]
    print(f"[{name}] building and timing ...", flush=True)
    row, t0 = dict(name=name), time.time()
    try:
        times, loss, params = fn(cfg, dev, a)
        row.update(ms=1e3 * statistics.median(times), loss=float(loss), params=params, cfg=cfg)
        if dev.type == "cuda": row["mem"] = torch.cuda.max_memory_allocated() - base
        # memory shown now too: a run cut off before the final table still has it
        mem = f"; peak memory {row['mem'] / 2 ** 30:.2f} GiB" if "mem" in row else ""
        if name.startswith("mtnlg"):
            from mtnlg.plan import memory_per_gpu
            mem += f" (planner {memory_per_gpu(cfg)['peak_bytes'] / 2 ** 30:.2f})"
        print(f"[{name}] median {row['ms']:.1f} ms (min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f}) over "
              f"{len(times)} steps; loss {row['loss']:.3f}{mem}; {time.time() - t0:.0f} s with building", flush=True)
    except Exception as e:
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        if "out of memory" in str(e).lower():
            row["error"] += " (try a smaller --micro-batch" + (", or --megatron-recompute selective)" if name == "megatron" else ")")
    return row


def run_isolated(name, cfg, argv):
    "Row `name` in a fresh process (the same flags, `--only name`): its row dict, or its error."
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--only" in argv: del argv[argv.index("--only"):argv.index("--only") + 2]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "row.json"
        p = subprocess.run([sys.executable, __file__, *argv, "--only", name, "--row-json", str(out)])
        if not out.exists(): return dict(name=name, error=f"its process ended with status {p.returncode}")
        return dict(json.loads(out.read_text()), cfg=cfg)


def version(pkg):
    try: return metadata.version(pkg)
    except metadata.PackageNotFoundError: return "not installed"


def main(argv=None):
    global torch
    a = parse_args(argv)
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""       # the project's code picks the GPU whenever one is visible
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_step: no CUDA device visible; run on a GPU machine, or pass --device cpu for a smoke test")
    from mtnlg.plan import flops_per_iteration, memory_per_gpu
    dev = torch.device(a.device)
    from mtnlg.config import ConfigError
    try: cfg, cfgs = make_config(a), {r: make_config(a, variant(r)) for r in a.rows}   # all checked before any work
    except ConfigError as e: sys.exit(f"gpu_step: bad configuration: {e}")
    if a.row_json:                                    # a child of run_isolated: one row, its result as JSON
        row = run_row(a.rows[0], cfgs[a.rows[0]], dev, a)
        row.pop("cfg", None)
        Path(a.row_json).write_text(json.dumps(row))
        return 0
    m, B = cfg.model, cfg.parallel.micro_batch
    flops = flops_per_iteration(cfg)                  # cfg.optim.global_batch == micro-batch: one step
    n, peak = matmul_peak(dev)
    kind = "bf16" if dev.type == "cuda" else "fp32"
    print(f"{kind} matmul {n}^3: {peak:.1f} TFLOP/s", flush=True)
    isolate = not a.in_process
    rows = [run_isolated(r, cfgs[r], argv) if isolate else run_row(r, cfgs[r], dev, a) for r in a.rows]

    name = torch.cuda.get_device_name() if dev.type == "cuda" else f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    print(f"\n## One training step (`benchmarks/gpu_step.py`)\n\nCommand: `python {' '.join(sys.argv)}`. "
          f"Date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC; device: {name}; "
          f"torch {torch.__version__}, deepspeed {version('deepspeed')}, megatron-core {version('megatron-core')}, "
          f"transformers {version('transformers')}, python {platform.python_version()}.\n\n"
          f"Config: preset {a.preset}, {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, seq "
          f"{m.seq_length}, vocab {m.vocab_size} padded to {m.padded_vocab_size(1)}, micro-batch {B}, dropout "
          f"{m.hidden_dropout}/{m.attention_dropout}, bf16; model FLOPs/step {flops:.4g} (mtnlg.plan.flops_per_iteration)."
          f" {'CUDA events' if dev.type == 'cuda' else 'Wall clock'}, median of {a.steps} steps after {a.warmup} "
          f"warm-up. {kind} matmul peak ({n}^3): {peak:.1f} TFLOP/s. megatron row recompute: {a.megatron_recompute}.\n")
    print("| row | ms/step | tokens/s | model TFLOP/s | of matmul peak | peak memory GiB | planner peak GiB | "
          "parameters | loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r.get("cfg", cfg)                          # an mtnlg+... row's own config
        B, flops = c.parallel.micro_batch, flops_per_iteration(c, recompute="none")   # model FLOPs: recompute not counted
        pl = f"{memory_per_gpu(c)['peak_bytes'] / 2 ** 30:.2f}" if r["name"].startswith("mtnlg") else "-"
        if "error" in r:
            print(f"| {r['name']} | failed: {r['error'].replace('|', '/')} | | | | | {pl} | | |"); continue
        s, tf = r["ms"] / 1e3, flops / (r["ms"] / 1e3) / 1e12
        mem = f"{r['mem'] / 2 ** 30:.2f}" if "mem" in r else "-"
        print(f"| {r['name']} | {r['ms']:.1f} | {B * c.model.seq_length / s:,.0f} | {tf:.2f} | {tf / peak:.1%} | {mem} | "
              f"{pl} | {r['params']:,} | {r['loss']:.3f} |")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
