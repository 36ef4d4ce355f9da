"""One rank of a torchrun (c10d) rendezvous across hosts: a gloo all_reduce of rank + 1, reported as one JSON line.

Started by torchrun on each host of a Slurm job (tests/test_multihost.py, benchmarks/rendezvous.py). The line holds
the rank, the world size, the host (`socket.gethostname()`, the UTS namespace's name in the test cluster), the
local and group (node) ranks torchrun gave it, the all_reduce result (world * (world + 1) / 2 when correct) and
the wall-clock time (`time.time()`) when the rendezvous and the first all_reduce were done.
"""
import json, os, socket, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
done = time.time()
print("RANK " + json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                            "host": socket.gethostname(), "local_rank": int(os.environ["LOCAL_RANK"]),
                            "group_rank": int(os.environ["GROUP_RANK"]), "sum": total.item(),
                            "master_addr": os.environ.get("MASTER_ADDR"), "t_done": done}), flush=True)
dist.destroy_process_group()
