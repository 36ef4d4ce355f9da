"""Issues 18/31/40 in one GPU call: the training step correct on CUDA, its memory against its dry run and the planner,
its speed against the baselines, and the largest GPT one GPU trains; one run of under 10 minutes, written to --out
as it goes.

Sections, in this order (correctness runs side by side, four at a time: none of them is timed; the rest alone).
Checks and sections that would start after --budget seconds are recorded as skipped. Each appends its table
to OUT/gpu_check.md and its records to OUT/gpu_check.jsonl the moment it ends, so a run cut off still leaves
what it finished; a failing check is recorded and the next one runs.
  correctness  `mtnlg train` as users run it (one process, real tokens from --data):
               - tiny and gpt3-1.3b, bf16, dropout 0.1, 10 steps: losses finite, the last three below the first;
               - tiny bf16 with dropout twice with one seed: bit-equal losses;
               - tiny fp32, dropout 0, on the GPU and on the CPU: losses within 1e-4;
               - tiny bf16 with dropout stopped at step 5 and resumed: steps 6-10 equal the uninterrupted run's;
               - tiny bf16 with `compile` on and off: losses within 2e-2 (relative).
  speed        benchmarks/gpu_step.py at micro-batch 8, then 4: this project's step (and with DeepSpeed's own bf16
               gradient path, its control), HF eager, HF + torch.compile, megatron-core's GPT (CUDA events,
               median), the matmul peak in the same run, peak memory and the planner's prediction.
  memory       gpt3-1.3b's real step (`mtnlg train`, 4 micro-batches of 4, torch.cuda.max_memory_allocated) against
               its dry run (`mtnlg plan --fake-run`, on this host's CPU) and the planner: within 5% is the goal.
  scale        the largest gpt3-shaped model the planner fits on this GPU (activation checkpointing,
               micro-batch 1): a few steps of this project's step, its TFLOP/s, measured and predicted peak memory.

On the lent GPU (torch is there; deepspeed, megatron-core and their needs travel as wheels):
    bash benchmarks/gpu_prepare.sh      # here: .whl/ (wheels for Python 3.12), .gpu/ (a tokenized corpus)
    # the device call, carry [".whl", ".gpu"], timeout 600 s (installs, runs this, copies the report to $OUT):
    bash benchmarks/gpu_run.sh --budget 500
CPU smoke test of every section (small sizes; minutes):
    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python benchmarks/gpu_check.py --device cpu \\
      --data .gpu/shakespeare --out /tmp/gpu_check
"""
import argparse, concurrent.futures as cf, contextlib, datetime, io, json, math, os, shutil, subprocess, sys
import threading, time
from pathlib import Path
from mtnlg import indexed as IX

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TINY = ["--preset", "tiny", "--steps", "10", "--global-batch", "8", "--micro-batch", "4", "--no-progress",
        "--set", "eval_interval=0", "--set", "save_interval=5", "--set", "optim.warmup_tokens=512"]
DROPOUT = ["--set", "model.hidden_dropout=0.1", "--set", "model.attention_dropout=0.1"]


class Report:
    "Appends Markdown to OUT/gpu_check.md and one JSON record per check to OUT/gpu_check.jsonl, flushed at once."
    def __init__(self, out: Path, budget: float):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.failed = 0
        self.deadline = time.time() + budget          # past it, checks and sections are recorded as skipped
        self.lock = threading.Lock()                  # correctness checks report from their own threads

    def left(self) -> float:
        "Seconds left of the run's budget."
        return self.deadline - time.time()

    def _append(self, name: str, text: str):
        with self.lock, open(self.out / name, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def md(self, text: str):
        print(text, flush=True)
        self._append("gpu_check.md", text + "\n")

    def record(self, section: str, name: str, ok: bool, **kw):
        self.failed += not ok
        self._append("gpu_check.jsonl", json.dumps(dict(section=section, check=name, ok=ok, **kw)) + "\n")
        detail = ", ".join(f"{k} {v}" for k, v in kw.items())
        self.md(f"| {name} | {'ok' if ok else 'FAILED'} | {detail} |")


class Tee(io.StringIO):
    "Keeps what is printed and passes it on at once (a run cut off still shows the rows it finished)."
    def write(self, s):
        sys.__stdout__.write(s)
        return super().write(s)


def train(a, run: Path, *flags, cpu=False, resume=False) -> list[float]:
    "Losses of `mtnlg train --out run flags` in a fresh process (on the CPU if `cpu`)."
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "4"))   # runs share the host
    if cpu or a.device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    cmd = [sys.executable, "-c", "import sys; from mtnlg.cli import main; sys.exit(main(sys.argv[1:]))", "train",
           "--out", str(run), *flags, *(["--resume"] if resume else ["--data", a.data])]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.run_timeout)
    run.parent.mkdir(parents=True, exist_ok=True)                     # a run that fails at once made no folder
    (run.parent / f"{run.name}.log").write_text(p.stdout[-20000:] + p.stderr[-20000:])
    if p.returncode: raise RuntimeError(f"mtnlg train failed ({p.returncode}): {p.stderr.strip()[-300:]}")
    from mtnlg.train import read_metrics
    return [r["loss"] for r in read_metrics(run)]


def falling(losses) -> bool:
    return all(map(math.isfinite, losses)) and sum(losses[-3:]) < sum(losses[:3])


def correctness(a, rep: Report, work: Path):
    "The five checks of the docstring, side by side (nothing here is timed); runs of one name are made once."
    rep.md("\n### Correctness (`mtnlg train`, one process)\n\n| check | result | detail |\n|---|---|---|")
    pool, made, made_lock = cf.ThreadPoolExecutor(a.parallel_runs), {}, threading.Lock()
    def once(a, run: Path, *flags, **kw):
        "The losses of run `run.name`, trained once in the pool whichever check asks first."
        with made_lock:
            if run.name not in made: made[run.name] = pool.submit(train, a, run, *flags, **kw)
            fut = made[run.name]
        return fut.result()
    def check(name, fn):
        t0 = time.time()
        if rep.left() < 60:
            return rep.record("correctness", name, False, error="skipped: the run's --budget is spent")
        try:
            ok, detail = fn()
            rep.record("correctness", name, ok, seconds=round(time.time() - t0), **detail)
        except Exception as e:
            rep.record("correctness", name, False, error=f"{type(e).__name__}: {e}"[:300])
    bf16 = [*TINY, "--precision", "bf16", *DROPOUT]
    def tiny_repeat():
        x, y = once(a, work / "tiny_a", *bf16), once(a, work / "tiny_b", *bf16)
        return falling(x) and x == y, dict(losses=[round(v, 4) for v in x], bit_equal=x == y)
    def big():
        flags = ["--preset", "gpt3-1.3b", "--steps", "10", "--global-batch", "4", "--micro-batch", "4",
                 "--precision", "bf16", "--no-progress", "--set", "eval_interval=0", "--set", "save_interval=0",
                 "--set", "optim.warmup_tokens=16384", "--set", "optim.rampup_batch_start=0"]
        if a.device == "cpu": flags += ["--layers", "2", "--hidden", "128", "--heads", "4", "--seq", "128"]
        x = once(a, work / "big", *flags)
        return falling(x), dict(losses=[round(v, 4) for v in x])
    def gpu_vs_cpu():
        flags = [*TINY, "--precision", "fp32"]
        x, y = once(a, work / "fp32_dev", *flags), once(a, work / "fp32_cpu", *flags, cpu=True)
        worst = max(abs(p - q) for p, q in zip(x, y))
        return len(x) == len(y) and worst <= 1e-4, dict(max_abs_diff=f"{worst:.2e}")
    def resume():
        whole = once(a, work / "tiny_a", *bf16)
        run = work / "resumed"
        once(a, run, *[f if f != "10" else "5" for f in bf16])           # --steps 5, checkpoint at 5
        again = train(a, run, "--steps", "10", "--no-progress", resume=True)   # the run's own settings
        return again[5:] == whole[5:], dict(after_resume=[round(v, 4) for v in again[5:]])
    def compiled():
        flags = [*TINY, "--precision", "bf16"]
        x, y = once(a, work / "eager", *flags), once(a, work / "compiled", *flags, "--set", "compile=true")
        worst = max(abs(p - q) / abs(p) for p, q in zip(x, y))
        return worst <= 2e-2, dict(max_rel_diff=f"{worst:.2e}")
    checks = []
    for name, fn in (("tiny bf16 + dropout: falling; same seed bit-equal", tiny_repeat),
                     ("gpt3-1.3b bf16 + dropout: finite and falling", big),
                     ("tiny fp32: this device = CPU within 1e-4", gpu_vs_cpu),
                     ("tiny bf16 + dropout: resume at step 5 = uninterrupted", resume),
                     ("tiny bf16: compile on = off within 2e-2", compiled)):
        if a.device == "cpu" and name.startswith("tiny fp32"): continue     # CPU against itself says nothing
        checks.append(threading.Thread(target=check, args=(name, fn)))
    for t in checks: t.start()
    for t in checks: t.join()
    pool.shutdown()


def speed(a, rep: Report):
    "gpu_step.py's table at each micro-batch (its rows, matmul peak, memory and the planner's peak)."
    import gpu_step
    rep.md("\n### Speed and memory (`benchmarks/gpu_step.py`)\n")
    for mb in a.micro_batches:
        if rep.left() < 150:
            rep.record("speed", f"micro-batch {mb}", False, error="skipped: the run's --budget is spent"); continue
        argv = ["--micro-batch", str(mb), "--steps", str(a.steps), "--warmup", str(a.warmup)]
        if a.rows: argv += ["--only", a.rows]
        if a.profile: argv += ["--profile"]
        if a.device == "cpu":
            argv += ["--device", "cpu", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "64",
                     "--only", "mtnlg,hf-eager"]
        buf = Tee()
        with contextlib.redirect_stdout(buf): code = gpu_step.main(argv)
        table = buf.getvalue()
        start = table.find("\n## One training step")
        rep.md(table[start:].replace("## One", "#### One") if start >= 0 else table[-4000:])
        rep.record("speed", f"micro-batch {mb}", code == 0, exit_status=code)


def memory(a, rep: Report, work: Path):
    "gpt3-1.3b's real step on this device against its dry run and the planner (issue 40)."
    if rep.left() < 150: return rep.record("memory", "gpt3-1.3b", False, error="skipped: the run's --budget is spent")
    nmb, run = 4, work / "memory-1.3b"
    flags = ["--preset", "gpt3-1.3b", "--steps", "2", "--global-batch", str(4 * nmb), "--no-progress",
             "--set", "log_interval=1", "--set", "eval_interval=0", "--set", "save_interval=0",
             "--set", "optim.rampup_batch_start=0", "--set", "optim.rampup_batch_increment=0"]
    train(a, run, *flags)
    from mtnlg.train import read_metrics
    real = max(r.get("mem_bytes", 0) for r in read_metrics(run))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="4")
    cmd = [sys.executable, "-c", "import sys; from mtnlg.cli import main; sys.exit(main(sys.argv[1:]))", "plan",
           "--preset", "gpt3-1.3b", "--fake-run", "--json", "--ranks", "0", "--micro-batches", str(nmb)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.run_timeout)
    if p.returncode: return rep.record("memory", "gpt3-1.3b", False, error=p.stderr.strip()[-300:])
    dry = json.loads(p.stdout.strip().splitlines()[-1])
    G = 2 ** 30
    what = "torch.cuda.max_memory_allocated" if a.device == "cuda" else "resident memory (not comparable on a CPU)"
    rep.md(f"\n### Memory: gpt3-1.3b's step against its dry run and the planner\n\n| | GiB |\n|---|---|\n"
           f"| real step ({what}) | {real / G:.2f} |\n| dry run (peak of the second step) | "
           f"{dry['peak_bytes'] / G:.2f} |\n| planner (`rank_memory`, moment {dry['planned_moment']}) | "
           f"{dry['planned_bytes'] / G:.2f} |\n\nreal / dry run {real / dry['peak_bytes']:.3f}, "
           f"real / planner {real / dry['planned_bytes']:.3f}.\n")
    rep.record("memory", "gpt3-1.3b", a.device != "cuda" or abs(real / dry["peak_bytes"] - 1) <= 0.05,
               real_gib=round(real / G, 2), dry_run_gib=round(dry["peak_bytes"] / G, 2),
               planned_gib=round(dry["planned_bytes"] / G, 2))


def largest_fit(gpu_bytes: float, seq: int = 2048, heads_dim: int = 128, hiddens=range(1024, 16385, 256)):
    "(layers, hidden, heads, predicted peak bytes) of the largest gpt3-shaped model the planner fits in `gpu_bytes`."
    from mtnlg.config import load_config
    from mtnlg.plan import memory_per_gpu
    best = None
    for hidden in hiddens:
        layers = max(2, round(hidden / 128))                  # GPT-3's shapes: about hidden / 128 layers
        ov = {"model.num_layers": layers, "model.hidden_size": hidden, "model.num_heads": hidden // heads_dim,
              "model.seq_length": seq, "parallel.micro_batch": 1, "optim.global_batch": 1, "precision": "bf16",
              "parallel.checkpoint_activations": 1, "optim.rampup_batch_start": 0}
        cfg = load_config("gpt3-1.3b", overrides=ov)
        peak = memory_per_gpu(cfg)["peak_bytes"]
        if peak <= 0.9 * gpu_bytes: best = (layers, hidden, hidden // heads_dim, peak)
    return best


def scale(a, rep: Report):
    "The planner's largest model for this GPU, trained for a few steps by gpu_step.py's project row."
    import gpu_step, torch
    if rep.left() < 120: return rep.record("scale", "largest model", False, error="skipped: the run's --budget is spent")
    total = torch.cuda.get_device_properties(0).total_memory if a.device == "cuda" else 2 ** 31
    small = dict(seq=64, heads_dim=32, hiddens=range(128, 513, 128))          # the CPU smoke test's sizes
    fit = largest_fit(total) if a.device == "cuda" else largest_fit(total, **small)
    if fit is None:
        return rep.record("scale", "largest model", False, error="the planner fits no model in this memory")
    layers, hidden, heads, peak = fit
    rep.md(f"\n### Scale: the largest model the planner fits ({total / 2 ** 30:.0f} GiB)\n\n"
           f"{layers} layers, hidden {hidden}, {heads} heads, activation checkpointing, micro-batch 1; "
           f"predicted peak {peak / 2 ** 30:.1f} GiB.\n")
    argv = ["--only", "mtnlg+parallel.checkpoint_activations=1", "--micro-batch", "1", "--layers", str(layers),
            "--hidden", str(hidden), "--heads", str(heads), "--steps", "3", "--warmup", "1"]
    if a.device == "cpu": argv += ["--device", "cpu", "--seq", "64"]
    buf = Tee()
    with contextlib.redirect_stdout(buf): code = gpu_step.main(argv)
    table = buf.getvalue()
    rep.md(table[table.index("| row"):] if "| row" in table else table[-3000:])
    rep.record("scale", f"{layers} x {hidden}", code == 0, predicted_gib=round(peak / 2 ** 30, 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.md, gpu_check.jsonl and the runs' logs")
    ap.add_argument("--data", default=None, help="tokenized corpus prefix (default: Tiny Shakespeare, tokenized here)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--sections", default="correctness,memory,speed,scale", help="comma-separated, in this order")
    ap.add_argument("--micro-batches", default="8,4", help="speed section's micro-batches, in this order")
    ap.add_argument("--rows", default=None, help="speed section's gpu_step.py rows (default: all of them)")
    ap.add_argument("--profile", action="store_true", help="speed section: profile the mtnlg rows (top kernels)")
    ap.add_argument("--budget", type=float, default=540, help="seconds for the whole run: checks and sections "
                    "that would start too late are recorded as skipped (a device call's limit is 600 s)")
    ap.add_argument("--parallel-runs", type=int, default=4, help="correctness runs at a time (none is timed)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per speed row")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per speed row first")
    ap.add_argument("--run-timeout", type=int, default=240, help="seconds one training run may take")
    a = ap.parse_args()
    a.micro_batches = [int(x) for x in a.micro_batches.split(",")]
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    out = Path(a.out)
    rep = Report(out, a.budget)
    work = out / "runs"
    shutil.rmtree(work, ignore_errors=True)
    if a.data is None: a.data = tokenize_shakespeare(out / "data")
    import torch
    gpu = a.device == "cuda" and torch.cuda.is_available()
    name = torch.cuda.get_device_name() if gpu else f"CPU ({os.cpu_count()} cores)"
    now = datetime.datetime.now(datetime.timezone.utc)
    rep.md(f"## GPU check (`benchmarks/gpu_check.py`)\n\nDate {now:%Y-%m-%d %H:%M} UTC; device: {name}; "
           f"torch {torch.__version__}; data {a.data}.")
    sections = dict(correctness=lambda: correctness(a, rep, work), memory=lambda: memory(a, rep, work),
                    speed=lambda: speed(a, rep),
                    scale=lambda: scale(a, rep))
    for s in a.sections.split(","):
        t0 = time.time()
        try: sections[s]()
        except Exception as e: rep.record(s, "section", False, error=f"{type(e).__name__}: {e}"[:300])
        rep.md(f"\n({s}: {time.time() - t0:.0f} s)")
    return 1 if rep.failed else 0


def tokenize_shakespeare(d: Path) -> str:
    "Tiny Shakespeare from tests/data (the committed fixture) as a GPT-2 BPE indexed dataset: the prefix."
    from mtnlg import data as D
    src = D.Source("shakespeare", str(HERE.parent / "tests/data/corpus/tinyshakespeare/input.txt"), split="blank")
    if not (d / "shakespeare.bin").exists(): IX.tokenize_to_indexed([src], d / "shakespeare", workers=1, log=None)
    return str(d / "shakespeare")


if __name__ == "__main__":
    sys.exit(main())
