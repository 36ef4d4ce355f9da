"""Worker of tests/test_checkpoint.py: launches of 2-rank runs (resumes of one run, each killed by SIGKILL at a point of
a save, then its last resume, to the end; and a new async run) in ONE process that imports the library once and
forks every launch's ranks from it.

Each case does what `mtnlg train [--resume]` does for a run of 2 ranks: the run's `config.json` with the case's
changes written as the launcher writes it (`prepare_run`), then two ranks (forked, with RANK, WORLD_SIZE, MASTER_ADDR
and a fresh MASTER_PORT, as torchrun sets them) that each run the launched rank's entry (`mtnlg.train.worker_main`),
the case's fault injection in their environment. When a rank exits with an error, the others get SIGTERM (SIGKILL
after 30 s), as torchrun's agent does. Writes OUT/<case>.json: the run's checkpoint folder of the case's `step`
afterwards (`folder_state`), rc (the first failing rank's exit code) and out (both ranks' output). The launcher's own
failure message after a kill is tested through `mtnlg train` (tests/test_train.py).

A case with `from` (a config.json) and its own `run` starts that new run instead of resuming.

Usage: python kill_worker.py PLAN.json OUT_DIR; PLAN: {"run": RUN, "cases": [{"name", "step", "set", "env"}, ...]}
"""
import json, os, signal, socket, sys, time, traceback
from pathlib import Path

GRACE_S = 30            # torchrun's agent: SIGTERM to the other ranks, SIGKILL after this


def folder_state(run, step: int) -> dict:
    "What a run's checkpoint folder of `step` holds, and what `latest` names."
    from mtnlg.train import read_metrics
    d = Path(run) / "checkpoints" / f"step{step:08d}"
    return dict(files=sorted(str(f.relative_to(d)) for f in d.rglob("*") if f.is_file()) if d.is_dir() else None,
                latest=(Path(run) / "checkpoints" / "latest").read_text().strip(),
                steps=[m["step"] for m in read_metrics(run)], losses=[m["loss"] for m in read_metrics(run)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank(run: Path, r: int, env: dict, log: Path, resume: bool) -> int:
    "In the forked child: output to `log`, the launcher's environment, then the launched rank's entry."
    from mtnlg.train import worker_main
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env, RANK=str(r), LOCAL_RANK=str(r), GROUP_RANK="0")
    return worker_main([str(run)] + (["--resume"] if resume else []) + ["--no-progress"])


def run_case(run: Path, case: dict, out: Path) -> dict:
    "One resume (or, with `from`, a new run on that config) on 2 forked ranks: exit code, output, folder state."
    from mtnlg.config import load_config
    from mtnlg.topology import HUNG_FILE_ENV
    from mtnlg.train import HUNG_FILE, prepare_run
    resume = "from" not in case
    cfg = load_config(None, run / "config.json" if resume else case["from"], overrides=case.get("set", {}))
    run = prepare_run(cfg, run, resume=resume)             # the launcher's checks, config.json written
    (run / HUNG_FILE).unlink(missing_ok=True)
    env = dict(case.get("env", {}), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", **{HUNG_FILE_ENV: str(run / HUNG_FILE)})
    logs = [out / f"{case['name']}.rank{r}.log" for r in range(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    for r in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try: code = rank(run, r, env, logs[r], resume)
            except BaseException: traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code if isinstance(code, int) else 1)
        pids.append(pid)
    codes, first_failed, stop_at = {}, None, None
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes: continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done: continue
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0 and first_failed is None:
                first_failed = codes[pid]
                for other in pids:
                    if other not in codes: os.kill(other, signal.SIGTERM)
                stop_at = time.monotonic() + GRACE_S
        if stop_at is not None and time.monotonic() > stop_at:
            for other in pids:
                if other not in codes: os.kill(other, signal.SIGKILL)
        time.sleep(0.05)
    logged = "".join(f.read_text() for f in logs)
    return dict(folder_state(run, case.get("step", 0)), rc=first_failed or 0, out=logged)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
    import mtnlg.train                                      # noqa: F401 (imported once, before any fork)
    plan, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    for case in plan["cases"]:
        got = run_case(Path(case.get("run", plan["run"])), case, out)
        tmp = out / f"{case['name']}.json.tmp"
        tmp.write_text(json.dumps(got))
        os.replace(tmp, out / f"{case['name']}.json")
