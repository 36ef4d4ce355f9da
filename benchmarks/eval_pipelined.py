"""Scoring throughput of `mtnlg.eval.pipeline_scorer` at PP2 and PP4: today's one micro-batch per pass (no length
buckets) against `in_flight = 2 x PP` micro-batches per pass (length buckets of 32), same requests, same engine, one
run, `--repeat` alternating passes; requests per second of each and the ratio pipelined / today. Each layout is one
launch of tests/pipelined_scoring_worker.py (tiny 8-layer fp32 model, 48 requests, batch 4, rank 0 leads as
`mtnlg eval` does); it also checks that the pipelined scores equal the one-micro-batch scores bit for bit.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_pipelined.py [--pp 2 4] [--repeat 3] [--out FILE.json]

On CPU processes sharing few cores the stages compete for the cores, so the ratio there is bounded by the CPU, not the
schedule; on one GPU per stage it tends to M / (M + PP - 1) busy time per stage against 1 / PP.
"""
import argparse, datetime, json, os, platform, statistics, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(pp: int, out: Path) -> dict:
    "One launch of the worker on pp processes (one replica); its JSON."
    sys.path.insert(0, str(ROOT))
    from mtnlg.jobs import launch_command
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    cmd = launch_command([str(ROOT / "tests" / "pipelined_scoring_worker.py"), str(out), str(pp)], pp)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env | {"OMP_NUM_THREADS": "1"}, cwd=ROOT)
    if p.returncode: sys.exit(f"PP{pp} launch failed:\n{p.stderr[-3000:]}")
    return json.loads(out.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeat", type=int, default=3, help="launches per layout (medians reported)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for pp in a.pp:
            runs = [launch(pp, Path(d) / f"pp{pp}_{r}.json") for r in range(a.repeat)]
            n = len(runs[0]["m1"]["ll"])
            today = statistics.median(r["today"]["seconds"] for r in runs)
            piped = statistics.median(r["pipelined"]["seconds"] for r in runs)
            rows.append(dict(pp=pp, in_flight=runs[0]["in_flight"], requests=n,
                             today_req_per_s=round(n / today, 2), pipelined_req_per_s=round(n / piped, 2),
                             ratio=round(today / piped, 3),
                             ratios_per_launch=[round(r["today"]["seconds"] / r["pipelined"]["seconds"], 3)
                                                for r in runs],
                             bitwise_equal_to_one_in_flight=all(r["pipelined"]["ll"] == r["m1"]["ll"]
                                                                for r in runs)))
    res = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
               machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}", rows=rows)
    print(f"{'PP':>3} {'M':>3} {'today req/s':>12} {'pipelined req/s':>16} {'ratio':>6}  per launch")
    for r in rows:
        print(f"{r['pp']:>3} {r['in_flight']:>3} {r['today_req_per_s']:>12} {r['pipelined_req_per_s']:>16} "
              f"{r['ratio']:>6}  {r['ratios_per_launch']}  equal: {r['bitwise_equal_to_one_in_flight']}")
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
