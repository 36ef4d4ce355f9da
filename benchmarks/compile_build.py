"""Issue 41: how long `compile` takes to build a GPT with dropout on this machine's CPU, default against
`parallel.compile_once`: frames and graphs dynamo compiles for all blocks and the seconds of the first forward +
backward (the build), with the `eager` backend (dynamo's tracing alone) and with inductor (the kernels too).
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/compile_build.py [--layers 6,24] [--backends eager,inductor]
"""
import argparse, json, os, sys, time
from pathlib import Path
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch


def build(layers, once, backend, hidden, seq):
    "(frames, graphs, seconds of the first step, seconds of the second) for one configuration."
    import torch._dynamo
    from dataclasses import replace
    from torch._dynamo.utils import counters
    from mtnlg.config import load_config, ParallelConfig
    from mtnlg.model import GPT, compile_blocks, init_parameters
    m = replace(load_config("tiny").model, num_layers=layers, hidden_size=hidden, seq_length=seq, vocab_size=1000,
                attention_dropout=0.1, hidden_dropout=0.1)
    model = init_parameters(GPT(m, parallel=ParallelConfig(compile_once=once)), m, seed=1).train()
    compile_blocks(model, backend=backend, **({"dynamic": False} if once else {}))
    torch._dynamo.reset()
    counters.clear()
    tokens = torch.randint(0, 1000, (2, seq))
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        model(tokens).float().sum().backward()
        times.append(time.perf_counter() - t0)
    out = counters["frames"]["total"], counters["stats"]["unique_graphs"], *times
    torch._dynamo.reset()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default="6,24")
    ap.add_argument("--backends", default="eager,inductor")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from mtnlg.config import ParallelConfig
    from mtnlg.topology import init_distributed, seed_all
    seed_all(1, init_distributed(ParallelConfig()))   # the attention dropout's model-parallel RNG
    rows = []
    print("| backend | layers | compile | frames | graphs | first step s (build) | second step s |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for backend in a.backends.split(","):
        for layers in map(int, a.layers.split(",")):
            for once in (False, True):
                f, g, first, second = build(layers, once, backend, a.hidden, a.seq)
                name = "compile_once" if once else "default"
                rows.append(dict(backend=backend, layers=layers, compile=name, frames=f, graphs=g,
                                 first_s=round(first, 2), second_s=round(second, 3)))
                print(f"| {backend} | {layers} | {name} | {f} | {g} | {first:.2f} | {second:.3f} |", flush=True)
    if a.json: Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
