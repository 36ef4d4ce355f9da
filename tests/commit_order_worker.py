"""Saves of a one-process engine (sync and async) with their file-system calls traced in order.

    python tests/commit_order_worker.py ROOT TRACES.json

Records every `os.fsync` (the path its descriptor names, and whether it is a folder), `os.replace` and `os.mkdir`
of each save, as the real calls happen. Each case saves into ROOT/CASE; the controls leave out the fsyncs of the
paths that end with a given text (they are not made).
"""
import dataclasses, json, os, sys
from pathlib import Path
import torch
from mtnlg.config import load_config
from mtnlg.topology import init_distributed, shutdown
from mtnlg.pipeline import build_pipeline, build_engine
from mtnlg.model import init_parameters
from mtnlg.checkpoint import Checkpointer

CASES = {"sync": (False, None), "async": (True, None),
         "no_data_fsync": (False, "__0_0.distcp"), "no_folder_fsync": (True, "step00000001")}
root, out = Path(sys.argv[1]), Path(sys.argv[2])
cfg = load_config("tiny", overrides={"vocab": 256, "layers": 1, "precision": "bf16", "zero": 1, "data": "mock"})
topo = init_distributed(cfg.parallel, run_cfg=cfg)
engine = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed))
data = torch.randint(0, 256, (cfg.optim.global_batch, cfg.model.seq_length + 1))
engine.train_batch(iter([(t[:, :-1], t[:, 1:]) for t in data.split(cfg.parallel.micro_batch)]))

trace, skip, real = [], [None], (os.fsync, os.replace, os.mkdir)


def fsync(fd):
    path = os.readlink(f"/proc/self/fd/{fd}")
    if skip[0] and path.endswith(skip[0]): return               # the control: this fsync is not made
    real[0](fd)
    trace.append(["fsync", path, os.path.isdir(path)])


def replace(src, dst, **kw):
    real[1](src, dst, **kw)
    trace.append(["replace", os.path.realpath(src), os.path.realpath(dst)])


def mkdir(path, *args, **kw):
    real[2](path, *args, **kw)
    trace.append(["mkdir", os.path.realpath(path)])


traces = {}
for name, (is_async, skip[0]) in CASES.items():
    trace.clear()
    os.fsync, os.replace, os.mkdir = fsync, replace, mkdir
    try:
        saver = Checkpointer(topo, dataclasses.replace(cfg, async_checkpoint=is_async), root / name)
        saver.save(engine, dict(step=1, consumed_samples=cfg.optim.global_batch, tokens=0, skipped=0))
        saver.wait()
    finally: os.fsync, os.replace, os.mkdir = real
    traces[name] = list(trace)
out.write_text(json.dumps(traces))
shutdown()
