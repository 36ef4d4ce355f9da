"""The work of tests/test_studies.py's fixture (tests/studies_worker.py: the ICL study on the nine paper tasks at one
process, then the TP2 x PP2 studies on one launch) at the old settings (8 documents a task, the bias draw again over
all its rows) and at the new (4 documents, the draw again over the study's first batch of 16 rows), one after the
other in one run: wall seconds, CPU seconds of every process it started (the ranks included), and what was scored.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies_fixture.py [new|old ...]

CPU seconds are the figure to compare on a shared machine (wall time there follows the other users' load). Writes
benchmarks/studies_fixture.json.
"""
import json, os, resource, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"old": dict(limit=8, again_rows=None), "new": dict(limit=4, again_rows=16)}
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
RUN = """import sys; from pathlib import Path
sys.path.insert(0, {tests!r})
import studies_worker as W
W.ICL["limit"] = {limit}
W.AGAIN_ROWS = {again_rows}
W.main(Path({out!r}), {data!r})"""


def children_cpu() -> float:
    "User + system seconds of the waited-for child processes (and theirs) so far."
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def scored(out: Path) -> dict:
    "Documents and log-likelihoods the ICL runs scored (both layouts), and the rows drawn again."
    import pandas as pd
    docs = lls = harness = 0
    for d in out.glob("*/*/documents.csv"):
        table = pd.read_csv(d)
        docs += len(table)
        lls += sum(len(json.loads(x)) for x in table.loglikelihoods)
        harness += sum(json.loads(f.read_text())["n"] for f in (d.parent / "eval_seed1").glob("*shot.json"))
    again = len(json.loads((out / "tp2pp2" / "ranks.json").read_text())["again"])
    return dict(variant_documents=docs, variant_loglikelihoods=lls, harness_documents=harness,
                rows_drawn_again=again)


def measure(name: str) -> dict:
    "One run of the worker at SETTINGS[name], in a fresh folder, as the fixture starts it."
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        code = RUN.format(tests=str(ROOT / "tests"), out=tmp, data=str(ROOT / "tests" / "data" / "eval"),
                          **SETTINGS[name])
        load, cpu0, t0 = os.getloadavg()[0], children_cpu(), time.time()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT / "nbs")
        wall, cpu = time.time() - t0, children_cpu() - cpu0
        assert p.returncode == 0, p.stderr[-3000:]
        return dict(settings=name, **SETTINGS[name], wall_s=round(wall, 1), cpu_s=round(cpu, 1),
                    load_before=round(load, 1), load_after=round(os.getloadavg()[0], 1), **scored(Path(tmp)))


if __name__ == "__main__":
    rows = []
    for name in sys.argv[1:] or ["old", "new"]:
        rows.append(measure(name))
        print(json.dumps(rows[-1]), flush=True)
    (ROOT / "benchmarks" / "studies_fixture.json").write_text(json.dumps(dict(
        machine="2-core AMD EPYC KVM (shared)", date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), runs=rows),
        indent=1))
