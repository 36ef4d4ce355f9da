"""The two-host training run of issue 25, recorded: TP2 x PP2 x DP2 across two hosts of the test suite's multi-host
Slurm cluster (tests/multihost.py) against the same run on this one host, as tests/test_hosts.py checks it.

`mtnlg job submit nbs/11_train_job.ipynb --nodes 2 --ntasks-per-node 4` (6 steps of the `tiny` preset, fp32, mock
data) on a private cluster of 2 namespace hosts; the one-host reference is `mtnlg train` on 8 local ranks. Printed: each
rank's hostname and each step's loss of both runs (Markdown, as `nbs/09_jobs.ipynb` shows them), the largest
difference, and the seconds from sbatch to the job's end; JSON to --out. Needs root. Run:

    sudo OMP_NUM_THREADS=1 .venv/bin/python benchmarks/two_hosts.py [--out benchmarks/two_hosts.json]
"""
import argparse, json, platform, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import multihost  # noqa: E402
import test_hosts as H  # noqa: E402  (the test's own submit and read helpers: the same run as the test's)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    why = multihost.unavailable()
    if why: sys.exit(f"two_hosts.py: cannot start a multi-host Slurm here: {why}")
    with tempfile.TemporaryDirectory(prefix="mtnlg-two-hosts-") as tmp:
        tmp = Path(tmp)
        ref = tmp / "reference"
        p = H.mtnlg("train", "--tp", 2, "--pp", 2, "--dp", 2, "--steps", 6, "--save-interval", 2, "--global-batch", 8,
                    "--precision", "fp32", "--data", "mock", "--out", ref, "--no-progress", env=H.local_env())
        if p.returncode: sys.exit(p.stderr[-3000:])
        cluster = multihost.start(tmp / "cluster", 2, tag="mhtwo")
        try:
            t0 = time.time()
            job, rd = H.submit_training(cluster, tmp / "runs", "two", "-p", "mode", "srun")
            info = cluster.wait_job(job, timeout=900)
            seconds = time.time() - t0
        finally:
            cluster.stop()
        if info["JobState"] != "COMPLETED": sys.exit(f"job {job}: {info['JobState']}\n{H.job_log(rd, job)[-3000:]}")
        (start,) = H.starts(rd / "train")
        two, one = H.losses(rd / "train"), H.losses(ref)
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{platform.machine()}, "
           f"{platform.node()}", "job": job, "node_list": info["NodeList"], "rank_hosts": start["hosts"],
           "losses_two_hosts": two, "losses_one_host": one, "sbatch_to_end_s": round(seconds, 1),
           "max_abs_diff": max(abs(two[s] - one[s]) for s in one)}
    print("| rank | " + " | ".join(map(str, range(len(res["rank_hosts"])))) + " |")
    print("|---|" + "---|" * len(res["rank_hosts"]))
    print("| host | " + " | ".join(res["rank_hosts"]) + " |\n")
    print("| step | two hosts | one host |\n|---:|---:|---:|")
    for s in sorted(one): print(f"| {s} | {two[s]:.6f} | {one[s]:.6f} |")
    print(f"\nlargest difference {res['max_abs_diff']:.2e}; sbatch to the job's end {res['sbatch_to_end_s']} s")
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
