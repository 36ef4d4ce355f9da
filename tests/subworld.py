"""One torchrun launch regrouped, phase by phase, into independent sub-worlds: the harness of the multi-process workers.

A plan is a list of phases; a phase, a list of jobs that run side by side; a job, a dict with a `name` and its
`ranks` = [first, count] of the launch. Each job gets its own process group (RANK, WORLD_SIZE, LOCAL_RANK and its
own MASTER_PORT, from which `mtnlg.topology.init_distributed` makes the group), so one 8-process launch runs e.g.
TP2xPP2xDP2 on all 8, then PP4 on 4 + TP2 on 2 + PP2 on 2, and so on.

Test side: `launch(worker, plan, out)` runs `torchrun --nproc-per-node N worker PLAN OUT`; `collect(out)` reads
what the jobs wrote. Worker side: `run_plan(run_job)` calls `run_job(job, out)` in each job's sub-world and writes
OUT/<job>.json (local rank 0's `out`), OUT/<job>.r<local>.json (every rank's, for a job with "per_rank") and
OUT/<job>.err<local>.json (a rank that failed); `write_json` writes any other file atomically.
"""
import json, os, subprocess, sys, time, traceback
from pathlib import Path


def write_json(path, obj):
    "Write `obj` as JSON to `path` through a temporary file (the test never reads half a file)."
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f: json.dump(obj, f)
    os.replace(tmp, path)


def run_plan(run_job, ports_per_job: int = 1) -> int:
    "Worker: run this rank's jobs of the plan `sys.argv[1]` in their sub-worlds, results into `sys.argv[2]`; exit code."
    from mtnlg.topology import shutdown
    plan, outdir = json.load(open(sys.argv[1])), sys.argv[2]
    grank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)   # sub-worlds make their own stores
    for phase in plan:
        for job in phase:
            port += ports_per_job                           # a job may take the ports after its own (MASTER_PORT + i)
            first, n = job["ranks"]
            if not first <= grank < first + n: continue
            local = grank - first
            os.environ.update(RANK=str(local), WORLD_SIZE=str(n), LOCAL_RANK=str(local), MASTER_PORT=str(port),
                              MASTER_ADDR="127.0.0.1")
            out, t0 = {"name": job["name"]}, time.time()
            try: run_job(job, out)
            except Exception as e:
                out["error"] = f"rank {grank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"
            out["seconds"] = round(time.time() - t0, 1)
            base = os.path.join(outdir, job["name"])
            if "error" in out: write_json(f"{base}.err{local}.json", out)
            elif job.get("per_rank"): write_json(f"{base}.r{local}.json", out)
            if local == 0 and "error" not in out: write_json(f"{base}.json", out)
            if "error" in out: return 1
            shutdown()
    return 0


def launch(worker, plan, out: Path, nprocs: int = 8, ports_per_job: int = 1, timeout: int = 900):
    "Test: run `worker` on `nprocs` processes with `plan`; (CompletedProcess, results as `collect` reads them)."
    from conftest import ROOT, free_port_block
    out = Path(out)
    (out / "plan.json").write_text(json.dumps(plan))
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore")
    port = free_port_block(1 + ports_per_job * sum(map(len, plan)))   # the sub-worlds use the ports after this one
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nprocs), "--master-port", str(port),
           str(worker), str(out / "plan.json"), str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return p, collect(out)


def collect(out: Path) -> dict:
    "{'jobs': {name: rank 0's result}, 'ranks': {name: [each rank's result]}, 'files': {name: {suffix: obj}}, 'errors'}."
    res = {"jobs": {}, "ranks": {}, "files": {}, "errors": []}
    for f in sorted(Path(out).glob("*.json")):
        if f.name == "plan.json": continue
        d = json.loads(f.read_text())
        name, _, suffix = f.name[:-len(".json")].partition(".")
        if suffix.startswith("err"): res["errors"].append(d["error"])
        elif suffix.startswith("r") and suffix[1:].isdigit(): res["ranks"].setdefault(name, []).append(d)
        elif suffix: res["files"].setdefault(name, {})[suffix] = d
        else: res["jobs"][name] = d
    return res
