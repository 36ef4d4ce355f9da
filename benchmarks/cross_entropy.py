"""The training loss on vocab-parallel logits: `mtnlg.model.lm_loss` against megatron-core's
`vocab_parallel_cross_entropy` (fp32 copy of the logits, padded columns masked), same logits, one run.

Per variant: forward + backward time (median of `--reps`; CUDA events on GPU, wall clock on CPU), the bytes the
loss keeps for the backward pass (counted with `torch.autograd.graph.saved_tensors_hooks`: what stays alive between
the forward and backward passes, beside the logits themselves) and the largest difference of loss and gradient.
    python benchmarks/cross_entropy.py                            # GPU if visible: 4 x 2048 tokens, vocab 50304
    OMP_NUM_THREADS=1 python benchmarks/cross_entropy.py --tokens 2048 --reps 3   # CPU
"""
import argparse, datetime, os, platform, statistics, sys, time
import torch


def megatron_loss(logits, labels, vocab_size):
    "The previous `lm_loss`: fp32 copy, padded columns set to -inf, megatron-core's vocab-parallel cross entropy."
    from megatron.core import tensor_parallel as tpl
    from mtnlg.model import _masked
    return tpl.vocab_parallel_cross_entropy(_masked(logits, vocab_size), labels).mean()


def saved_bytes(fn, *args):
    "Bytes of the tensors autograd saves while running `fn(*args)` (the logits' own storage not counted)."
    seen, logits_ptr = {}, args[0].untyped_storage().data_ptr()
    def pack(t):
        p = t.untyped_storage().data_ptr()
        if p != logits_ptr: seen[p] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, sum(seen.values())


def timed(fn, logits, labels, V, reps, dev):
    "Median seconds of forward + backward."
    times = []
    for i in range(reps + 1):
        x = logits.detach().requires_grad_()
        if dev.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(x, labels, V).backward(); e.record(); torch.cuda.synchronize(); t = s.elapsed_time(e) / 1e3
        else:
            t0 = time.perf_counter(); fn(x, labels, V).backward(); t = time.perf_counter() - t0
        if i: times.append(t)                          # the first is warm-up
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=None, help="rows (micro-batch x seq); default 8192 on GPU, 2048 on CPU")
    ap.add_argument("--vocab", type=int, default=50257, help="real vocabulary (padded to a multiple of 128)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (default 20 on GPU, 3 on CPU)")
    a = ap.parse_args(argv)
    from mtnlg.config import ParallelConfig
    from mtnlg.topology import init_distributed, shutdown
    from mtnlg.model import lm_loss
    topo = init_distributed(ParallelConfig())
    dev = topo.device
    N = a.tokens or (8192 if dev.type == "cuda" else 2048)
    reps = a.reps or (20 if dev.type == "cuda" else 3)
    Vp = -(-a.vocab // 128) * 128
    g = torch.Generator(device=dev).manual_seed(0)
    labels = torch.randint(0, a.vocab, (N,), device=dev, generator=g)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    print(f"## Training loss on vocab-parallel logits (`benchmarks/cross_entropy.py`)\n\nDate "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; device {name}; torch {torch.__version__}; "
          f"{N} tokens x {Vp} padded vocabulary ({a.vocab} real); median of {reps} forward+backward.\n")
    print("| logits | loss | ms fwd+bwd | saved for backward MiB | vs megatron time | max loss diff | max grad diff |")
    print("|---|---|---:|---:|---:|---:|---:|")
    try:
        for dtype in (torch.bfloat16, torch.float32):
            logits = (torch.randn(N, Vp, device=dev, generator=g) * 2).to(dtype)
            res = {}
            for nm, fn in (("megatron", megatron_loss), ("mtnlg", lm_loss)):
                x = logits.detach().requires_grad_()
                loss, nbytes = saved_bytes(fn, x, labels, a.vocab)
                loss.backward()
                res[nm] = dict(loss=loss.detach().float(), grad=x.grad.float(), bytes=nbytes,
                               s=timed(fn, logits, labels, a.vocab, reps, dev))
                del x, loss
            m = res["megatron"]
            for nm, r in res.items():
                print(f"| {str(dtype).split('.')[-1]} | {nm} | {r['s'] * 1e3:.1f} | {r['bytes'] / 2 ** 20:.0f} | "
                      f"{r['s'] / m['s']:.2f}x | {(r['loss'] - m['loss']).abs().item():.1e} | "
                      f"{(r['grad'] - m['grad']).abs().max().item():.1e} |")
            del res, logits
    finally: shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
