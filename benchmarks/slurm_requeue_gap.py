"""Seconds a requeued job waits before it runs again on the tests' one-node Slurm (tests/slurm_local.py), with the
scheduler's default passes (backfill every 30 s, main pass every 60 s) and with `bf_interval=1`.

Each variant starts its own cluster, submits a requeueable `sleep` job, requeues it once it runs (`scontrol requeue`,
what the jobs' USR1 trap does) and times requeue -> running again (the hold is cred_expire=10 s + 1 s either way).
Usage: python benchmarks/slurm_requeue_gap.py [out.json]   (root; writes benchmarks/slurm_requeue_gap.json)
"""
import json, shutil, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import slurm_local

LINE = "SchedulerParameters=bf_interval=1\n"

def state(job, env):
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, env=env).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

def wait_for(cond, timeout=300):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.2)

def requeue_gap(backfill_every_second: bool) -> float:
    conf = slurm_local.CONF
    slurm_local.CONF = conf if backfill_every_second else conf.replace(LINE, "")
    try:
        root = tempfile.mkdtemp(prefix="requeue-gap-")
        cluster = slurm_local.start(root)
    finally:
        slurm_local.CONF = conf
    try:
        env = cluster.env()
        job = subprocess.run(["sbatch", "--parsable", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600"],
                             capture_output=True, text=True, env=env, check=True).stdout.strip()
        wait_for(lambda: state(job, env)["JobState"] == "RUNNING")
        t0 = time.monotonic()
        subprocess.run(["scontrol", "requeue", job], check=True, env=env)
        wait_for(lambda: state(job, env)["Restarts"] == "1" and state(job, env)["JobState"] == "RUNNING")
        return round(time.monotonic() - t0, 1)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

if __name__ == "__main__":
    res = {"default_passes_s": requeue_gap(False), "bf_interval_1_s": requeue_gap(True),
           "cred_expire_s": 10, "machine": "2-core AMD EPYC KVM, shared", "date": time.strftime("%Y-%m-%d")}
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "slurm_requeue_gap.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))
