"""Worker of tests/test_alive.py: two ranks whose rank 0 works alone past the group timeout, each wait beside a control.

`python alive_worker.py OUT TIMEOUT_S` under torchrun (2 processes). Rank 1 waits for rank 0 in `from_leader`, then
in `broadcast_waiting`. Once it waits (its main thread seen inside the collective), a second thread of rank 1 starts
the control: the same wait in a plain collective with the same timeout (`monitored=False` on the process group, the
way every wait was before; a spare group for the first case), which rank 0 never joins. Rank 0 works alone until
that control has ended (an event: the control's file, not a time), so each monitored wait outlasts a plain wait
that timed out beside it. Each rank writes OUT/rank<R>.json: each case's value or error.
"""
import json, os, sys, threading, time, traceback
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist
from mtnlg.config import ParallelConfig
from mtnlg.topology import broadcast_waiting, from_leader, init_distributed, shutdown

out, timeout_s = Path(sys.argv[1]), float(sys.argv[2])
topo = init_distributed(ParallelConfig(dp=2), timeout_s=timeout_s)
spare = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))    # the first case's control group
got = {}

def case(name, fn):
    try: got[name] = fn()
    except Exception as e: got[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}

def waiting(thread_id) -> bool:
    "Whether thread `thread_id` is inside a torch.distributed broadcast (rank 1's monitored wait has begun)."
    f = sys._current_frames().get(thread_id)
    while f is not None:
        if f.f_code.co_name == "broadcast" and f.f_code.co_filename.endswith("distributed_c10d.py"): return True
        f = f.f_back
    return False

def control(name, plain, main):
    "Rank 1's second thread: once `main` waits, the plain wait `plain()` beside it; then the event for rank 0."
    while not waiting(main): time.sleep(0.01)
    case(name, plain)
    (out / f"{name}.done").touch()

def alone(name):
    "Rank 0 works alone (hashing, reading, a study's idle notebook) until rank 1's control `name` has ended."
    for _ in range(int(200 * timeout_s)):                # at most 20 x the timeout (the control ends at 1 x)
        if (out / f"{name}.done").exists(): return
        time.sleep(0.1)
    raise TimeoutError(f"control {name} never ended")

def watched(name, plain, wait):
    "`wait()` on this rank; on rank 1 with the control `plain` started beside it once it waits."
    if topo.rank == 0: return wait()
    t = threading.Thread(target=control, args=(name, plain, threading.get_ident()))
    t.start()
    try: return wait()
    finally: t.join()

def work():
    alone("plain_spare")
    return {"from": topo.rank, "value": 42}

def sent():
    t = torch.zeros(3, dtype=torch.long)
    if topo.rank == 0: alone("plain"); t += torch.tensor([7, 8, 9])
    broadcast_waiting(t, 0)
    return t.tolist()

zeros = lambda: torch.zeros(3, dtype=torch.long)
case("from_leader", lambda: watched("plain_spare", lambda: (dist.broadcast(zeros(), 0, group=spare), "sent")[1],
                                    lambda: from_leader(work)))
# the control of the second case: the process group's own collective (after its timeout the group is broken)
case("broadcast_waiting", lambda: watched("plain", lambda: broadcast_waiting(zeros(), 0, monitored=False).tolist(),
                                          sent))
tmp = out / f"rank{topo.rank}.json.tmp"
tmp.write_text(json.dumps(got))
os.replace(tmp, out / f"rank{topo.rank}.json")
try: shutdown()                                          # after the control's timeout the default group is broken
except Exception: traceback.print_exc()
