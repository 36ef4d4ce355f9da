"""Worker launched by tests/test_hosts.py under torchrun: which checkpoint the ranks of a resumed run load.

Each job gives every rank its own view of the run folder (`runs[rank]`: copies that differ as two nodes' views of
a shared file system can), makes the job's process group with the library's `init_distributed`, and calls
`mtnlg.train.resume_checkpoint`; every rank writes what it picked (and what it alone would have picked), or the
refusal it raised, to OUT/<job>.r<rank>.json (tests/subworld.py); any other error goes to OUT/<job>.err<rank>.json.

Usage: torchrun --nproc-per-node 2 tests/resume_worker.py PLAN.json OUT_DIR
"""
import os, sys, warnings
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
os.environ.setdefault("DS_ACCELERATOR", "cpu")
from mtnlg.config import ConfigError, ParallelConfig
from mtnlg.checkpoint_folders import latest_checkpoint
from mtnlg.topology import init_distributed
from mtnlg.train import TrainingError, resume_checkpoint
from subworld import run_plan


def run_job(job, out):
    topo = init_distributed(ParallelConfig(dp=job["ranks"][1]), timeout_s=120)
    run = job["runs"][topo.rank]
    try: alone = latest_checkpoint(run)
    except ConfigError as e: alone = f"refused: {e}"                # `latest` names a folder this rank cannot see
    out.update(rank=topo.rank, alone=getattr(alone, "name", alone))
    try: out["picked"] = resume_checkpoint(run, topo).name
    except TrainingError as e: out["refused"] = str(e)             # raised on every rank alike


if __name__ == "__main__":
    sys.exit(run_plan(run_job))
