"""Rendezvous and start-up time at 1, 2 and 3 hosts, on the multi-host Slurm cluster of the test suite.

One private Slurm cluster of 3 namespace hosts (tests/multihost.py: each host its own network, UTS and mount
namespace and slurmd, on a private bridge); jobs of `-N 1`, `-N 2` and `-N 3` each run one torchrun a host
(`srun`), 2 gloo ranks a host, c10d rendezvous at the first host, and one all_reduce (tests/rendezvous_worker.py).
Measured per job: wall time from the `sbatch` call to the last rank past the rendezvous and its first all_reduce,
split into sbatch -> batch script start (scheduling, launch) and batch start -> last rank done (srun, torchrun,
python + torch import, rendezvous, all_reduce). The host counts run interleaved `--repeat` times (1, 2, 3, 1, 2,
3, ...); reported: medians and the ratios 2-host/1-host and 3-host/1-host (the machine's CPUs are shared by all
hosts, so the ratios include the extra processes competing for 2 cores). Needs root. Run (a table to stdout,
JSON to --out):

    sudo OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rendezvous.py [--repeat 3 --out benchmarks/rendezvous.json]
"""
import argparse, json, os, platform, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import multihost  # noqa: E402

def measure(cluster, nodes: int, nproc_per_node: int) -> dict:
    "One job on `nodes` hosts; seconds from sbatch to batch start and to the last rank done, checked results."
    cluster.wait_nodes(cluster.hosts, ("idle",), 60)
    t0 = time.time()
    batch = multihost.torchrun_script(nodes, nproc_per_node, prelude='echo "BATCH_START $(date +%s.%N)"\n')
    j = cluster.submit(batch, "-N", str(nodes), "--ntasks-per-node=1", "--time=00:10:00",
                       name=f"rdzv{nodes}")
    info = cluster.wait_job(j, timeout=600)
    out = cluster.output(j, f"rdzv{nodes}")
    if info["JobState"] != "COMPLETED":
        raise RuntimeError(f"job {j} on {nodes} host(s): {info['JobState']}\n{out}")
    ranks = [json.loads(f.read_text()) for f in (cluster.root / "jobs" / f"ranks-{j}").glob("rank-*.json")]
    world = nodes * nproc_per_node
    hosts = sorted({r["host"] for r in ranks})
    if len(ranks) != world or {r["sum"] for r in ranks} != {world * (world + 1) / 2} or len(hosts) != nodes:
        raise RuntimeError(f"job {j}: wrong ranks {ranks}\n{out}")
    start = float(next(l.split()[1] for l in out.splitlines() if l.startswith("BATCH_START ")))
    done = max(r["t_done"] for r in ranks)
    return {"nodes": nodes, "ranks": world, "hosts": hosts, "job": j, "total_s": done - t0,
            "sbatch_to_start_s": start - t0, "start_to_allreduce_s": done - start}

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3], help="host counts to compare (first: base)")
    ap.add_argument("--nproc-per-node", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", default=None, help="cluster folder (default: a temporary one, removed at the end)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    why = multihost.unavailable()
    if why: sys.exit(f"rendezvous.py: cannot start a multi-host Slurm here: {why}")
    tmp = None if a.root else tempfile.TemporaryDirectory(prefix="mtnlg-rdzv-")
    t_start = time.time()
    cluster = multihost.start(a.root or tmp.name, max(a.hosts), tag="mhbench")
    try:
        runs = [measure(cluster, n, a.nproc_per_node) for _ in range(a.repeat) for n in a.hosts]
    finally:
        cluster.stop()
        if tmp: tmp.cleanup()
    med = {n: {k: statistics.median(r[k] for r in runs if r["nodes"] == n)
               for k in ("total_s", "sbatch_to_start_s", "start_to_allreduce_s")} for n in a.hosts}
    base = a.hosts[0]
    print(f"rendezvous + first all_reduce, {a.nproc_per_node} gloo ranks a host, median of {a.repeat} "
          f"(interleaved), {platform.machine()} {os.cpu_count()} CPUs")
    print("| hosts | ranks | sbatch -> all ranks done (s) | sbatch -> batch start (s) | batch start -> done (s) "
          f"| total / {base}-host |")
    print("|---|---|---|---|---|---|")
    for n in a.hosts:
        m = med[n]
        print(f"| {n} | {n * a.nproc_per_node} | {m['total_s']:.2f} | {m['sbatch_to_start_s']:.2f} | "
              f"{m['start_to_allreduce_s']:.2f} | {m['total_s'] / med[base]['total_s']:.2f} |")
    print("runs (hosts: total s):", ", ".join(f"{r['nodes']}: {r['total_s']:.2f}" for r in runs))
    print(f"whole benchmark (cluster start and stop included): {time.time() - t_start:.0f} s")
    if a.out:
        Path(a.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
                                           "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
                                           "nproc_per_node": a.nproc_per_node, "repeat": a.repeat,
                                           "median": med, "runs": runs}, indent=1))

if __name__ == "__main__":
    main()
