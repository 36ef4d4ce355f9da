"""Issue 41: the loss over 2048 x 50304 logits (one sequence of gpt3-1.3b, the padded GPT-2 vocabulary), forward and
backward, on this machine's CPU: peak memory allocated (torch's profiler, compiled kernels included), copies
(aten copy_ and _to_copy) and wall time, for the blocked loss (`VocabParallelCrossEntropy`, today's) and the one-pass
loss (`parallel.one_pass_loss`), in fp32 and bf16; the two's loss and largest gradient difference.
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/loss_one_pass.py [--rows 2048] [--json benchmarks/loss_one_pass.json]
"""
import argparse, json, os, sys, time
from pathlib import Path
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import torch
from test_fast_step import profiled                  # the tests' measure: the profiler's allocations and ops


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=50304)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from mtnlg.config import ParallelConfig
    from mtnlg.model import lm_loss
    from mtnlg.topology import init_distributed
    init_distributed(ParallelConfig())
    g = torch.Generator().manual_seed(0)
    z, labels = torch.randn(a.rows, a.cols, generator=g).mul_(3), torch.randint(0, a.vocab, (a.rows,), generator=g)
    rows, MiB = [], 2 ** 20
    print(f"| dtype | loss | peak MiB | gradient MiB | copies | s (2 cores, shared) |\n|---|---|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        got = {}
        for one_pass in (False, True):
            x = z.to(dtype).clone().requires_grad_()
            def step():
                x.grad = None
                loss = lm_loss(x[None], labels[None], a.vocab, one_pass)
                loss.backward()
                return loss
            step()                                    # the one-pass kernels compile here
            t0 = time.perf_counter()
            loss = step()
            seconds = time.perf_counter() - t0
            got[one_pass] = loss.detach(), x.grad.float()
            peak, ops = profiled(step)
            copies = ops["aten::copy_"] + ops["aten::_to_copy"]
            name = "one pass" if one_pass else "blocks (today)"
            grad_mib = x.grad.numel() * x.grad.element_size() / MiB
            rows.append(dict(dtype=str(dtype), loss=name, peak_mib=round(peak / MiB), grad_mib=round(grad_mib),
                             copies=copies, seconds=round(seconds, 2)))
            print(f"| {dtype} | {name} | {peak / MiB:.0f} | {grad_mib:.0f} | {copies} | {seconds:.2f} |")
        dl, dg = (got[False][0] - got[True][0]).abs().item(), (got[False][1] - got[True][1]).abs().max().item()
        rows.append(dict(dtype=str(dtype), loss_diff=dl, grad_max_diff=dg))
        print(f"\n{dtype}: loss difference {dl:.2e}, largest gradient difference {dg:.2e}\n")
    if a.json: Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
