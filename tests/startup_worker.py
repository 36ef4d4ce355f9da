"""Worker of tests/test_startup.py: two ranks whose rank 1 starts LATE_S seconds after rank 0 reached its start.

`python startup_worker.py OUT TIMEOUT_S LATE_S` under torchrun, or as a plain process with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set (as srun starts ranks). Rank 0 marks OUT/rank0.arrived just before
`init_distributed`; rank 1 waits for that mark, then LATE_S more (so the lag is LATE_S however slowly either
imported). Both then all-reduce their rank + 1. Each rank writes OUT/rank<R>.json: the sum, or the error.
"""
import json, os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
import mtnlg.topology as topology
from mtnlg.config import ParallelConfig

out, timeout_s, late_s = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
# what init_distributed does before it reaches the store, done before the mark: the lag is then LATE_S at the store
topology.patches.import_megatron()
topology.patches.import_deepspeed_muon()
topology.apply_cpu_patches()
import deepspeed                                   # noqa: F401,E402
rank = int(os.environ["RANK"])
if rank == 0: (out / "rank0.arrived").touch()
else:
    while not (out / "rank0.arrived").exists(): time.sleep(0.05)
    time.sleep(late_s)
try:
    topology.init_distributed(ParallelConfig(dp=2), timeout_s=timeout_s)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    got = {"sum": total.item()}
    topology.shutdown()
except Exception as e:
    got = {"error": f"{type(e).__name__}: {e}"[:2000]}
(out / f"rank{rank}.json").write_text(json.dumps(got))
sys.exit(1 if "error" in got else 0)
