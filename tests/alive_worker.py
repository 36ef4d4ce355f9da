"""Worker of tests/test_alive.py: two ranks whose rank 0 works alone for over twice the group timeout, three ways.

`python alive_worker.py OUT TIMEOUT_S` under torchrun (2 processes). Rank 0 sleeps 2.2 x TIMEOUT_S alone in each
case while rank 1 waits: in `from_leader`, in `broadcast_waiting`, then (the control) in `broadcast_waiting` with
`monitored=False`, the process group's own collective. Each rank writes OUT/rank<R>.json: each case's value or error.
"""
import json, os, sys, time, traceback
import torch
from mtnlg.config import ParallelConfig
from mtnlg.topology import broadcast_waiting, from_leader, init_distributed, shutdown

out, timeout_s = sys.argv[1], float(sys.argv[2])
topo = init_distributed(ParallelConfig(dp=2), timeout_s=timeout_s)
alone = 2.2 * timeout_s
got = {}

def case(name, fn):
    try: got[name] = fn()
    except Exception as e: got[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}

def work():
    time.sleep(alone)                                   # rank 0 alone: hashing, reading, a study's idle notebook
    return {"from": topo.rank, "value": 42}

def sent(monitored):
    t = torch.zeros(3, dtype=torch.long)
    if topo.rank == 0: time.sleep(alone); t += torch.tensor([7, 8, 9])
    broadcast_waiting(t, 0, monitored=monitored)
    return t.tolist()

case("from_leader", lambda: from_leader(work))
case("broadcast_waiting", lambda: sent(True))
case("plain", lambda: sent(False))                      # the control: today's wait, the group's timeout
tmp = os.path.join(out, f"rank{topo.rank}.json.tmp")
with open(tmp, "w") as f: json.dump(got, f)
os.replace(tmp, os.path.join(out, f"rank{topo.rank}.json"))
try: shutdown()                                          # after the control's timeout the default group is broken
except Exception: traceback.print_exc()
