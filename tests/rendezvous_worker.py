"""One rank of a torchrun (c10d) rendezvous across hosts: a gloo all_reduce of rank + 1, reported as JSON.

Started by torchrun on each host of a Slurm job (tests/test_multihost.py, benchmarks/rendezvous.py) as
`rendezvous_worker.py OUT_DIR`: writes OUT_DIR/rank-R.json (the shared file system; not stdout, where srun may
merge the lines of several ranks into one). It holds the rank, the world size, the host (`socket.gethostname()`,
the UTS namespace's name in the test cluster), the local and group (node) ranks torchrun gave it, the all_reduce
result (world * (world + 1) / 2 when correct) and the wall-clock time (`time.time()`) when the rendezvous and
the first all_reduce were done.
"""
import json, os, socket, sys, time
from pathlib import Path
import torch
import torch.distributed as dist

out = Path(sys.argv[1])
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
done = time.time()
report = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "host": socket.gethostname(),
          "local_rank": int(os.environ["LOCAL_RANK"]), "group_rank": int(os.environ["GROUP_RANK"]),
          "sum": total.item(), "master_addr": os.environ.get("MASTER_ADDR"), "t_done": done}
tmp = out / f".rank-{dist.get_rank()}.json.tmp"
tmp.write_text(json.dumps(report))
os.replace(tmp, out / f"rank-{dist.get_rank()}.json")
dist.destroy_process_group()
