"""The planner against dry runs of configurations drawn at random (the draws of tests/test_dryrun.py: its seed and
count): how many were counted and refused, the worst measured/planned ratio per category, and how many the planner as
it was (commit OLD) missed. Writes benchmarks/plan_draws.json. Run: .venv/bin/python benchmarks/plan_draws.py"""
import json, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import test_dryrun as T                                         # noqa: E402  (its draws, comparison and control)
from plan_draws_worker import config, rows as dry_runs          # noqa: E402
from mtnlg import plan as P                                     # noqa: E402

t0 = time.time()
rows, old = list(dry_runs([str(T.SEED), str(T.DRAWS)])), T.old_planner()
worst, counted, missed, old_missed = {}, 0, [], 0
for x in rows:
    if x["refused"]: continue
    counted += 1
    cfg, r = config(x["draw"]), x["result"]
    if T.held(P, cfg, r, new=True): missed.append(x["index"])
    old_missed += bool(T.held(old, cfg, r, new=False))
    for c in T.CATEGORIES + ("peak",):
        got, want = (r["peak_bytes"], r["planned_bytes"]) if c == "peak" else (r["measured"][c], r["planned"][c])
        if want and got: worst[c] = max(worst.get(c, 1.0), got / want, want / got)
out = dict(seed=T.SEED, draws=len(rows), counted=counted, refused=len(rows) - counted, missed=missed,
           old_planner_missed=old_missed, worst_ratio={k: round(v, 5) for k, v in worst.items()},
           refusals=sorted({x["refused"].split(":")[0] for x in rows if x["refused"]}), wall_s=round(time.time() - t0))
(ROOT / "benchmarks" / "plan_draws.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
