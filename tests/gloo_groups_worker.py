"""One rank of tests/test_gloo_groups.py: sockets this rank holds after making a group lazily (`lazy_gloo_group`) and
eagerly (plain `new_group`, the control), and after a broadcast and a gather in each; written to OUT/rank<R>.json."""
import json, os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from mtnlg.topology import lazy_gloo_group

def sockets() -> int:
    "Sockets this process holds open."
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try: n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError: pass
    return n

def use(group):
    "A broadcast from rank 0 and a gather of every rank's object, as the long group's waits do."
    t = torch.tensor([float(dist.get_rank())])
    dist.broadcast(t, 0, group=group)
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, dist.get_rank(), group=group)
    assert t.item() == 0.0 and got == list(range(dist.get_world_size()))

dist.init_process_group("gloo", timeout=timedelta(seconds=300))
counts = {}
for kind in ("lazy", "eager"):
    dist.barrier()
    before = sockets()
    group = lazy_gloo_group(timedelta(seconds=300)) if kind == "lazy" else dist.new_group(backend="gloo")
    dist.barrier()                  # every rank has made it, none uses it yet (a use would connect pairs to this rank)
    counts[f"{kind}_made"] = sockets() - before
    dist.barrier()
    use(group)
    dist.barrier()                  # every rank's use done: no peer connects to this rank after the count
    counts[f"{kind}_used"] = sockets() - before
    counts["lazy_env_after"] = os.environ.get("TORCH_GLOO_LAZY_INIT")
dist.barrier()
out = os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json")
with open(out + ".tmp", "w") as f: json.dump(counts, f)
os.replace(out + ".tmp", out)
dist.destroy_process_group()
