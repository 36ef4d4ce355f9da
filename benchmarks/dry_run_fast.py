"""`mtnlg plan --fake-run` of the 530B preset's three default ranks (fast: steps of 2 and 3 micro-batches,
extrapolated to 240), timed, with each rank's measured peak against the planner's. Writes benchmarks/dry_run_fast.json.
Run: .venv/bin/python benchmarks/dry_run_fast.py"""
import json, os, subprocess, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
MTNLG = str(Path(sys.executable).parent / "mtnlg")

load = os.getloadavg()[0]
t0 = time.time()
p = subprocess.run([MTNLG, "plan", "--fake-run", "--json", "--preset", "mtnlg-530b"], cwd=ROOT, capture_output=True,
                   text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
wall = time.time() - t0
ranks = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
out = dict(command="mtnlg plan --fake-run --preset mtnlg-530b", wall_s=round(wall, 1), load_average_at_start=load,
           cpus=os.cpu_count(),
           ranks=[dict(rank=r["rank"], stage=r["stage"], wall_s=round(r["wall_s"], 1), step_seconds=r["step_seconds"],
                       extrapolated=r.get("extrapolated"), peak_measured_over_planned=r["peak_bytes"] / r["planned_bytes"])
                  for r in ranks])
(ROOT / "benchmarks" / "dry_run_fast.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
