"""Ranks that start far apart (imports from a shared file system on many hosts) still make their process group: each
waits at the launch's store for the last one (`mtnlg.config.startup_seconds()`: half an hour, or the launch's
$MTNLG_STARTUP_S), not only the run's `timeout_s`, which a user shortens to find a hung rank fast. Three 2-rank launches side by side: torchrun (its agent's store), plain
processes as srun starts them (rank 0's store), and the control, whose wait is the timeout alone."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from conftest import LAUNCHER_VARS, free_port

pytestmark = pytest.mark.slow      # three launches of two gloo ranks
WORKER = str(Path(__file__).parent / "startup_worker.py")
TIMEOUT_S, LATE_S = 8, 16          # rank 1 starts 16 s after rank 0, twice the run's timeout_s

def launch(out: Path, how: str, startup_s: str | None) -> list:
    "Two ranks of tests/startup_worker.py started `how` (torchrun, or plain processes as srun starts them)."
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (*LAUNCHER_VARS, "MTNLG_STARTUP_S")} | {"OMP_NUM_THREADS": "1"}
    if startup_s is not None: env["MTNLG_STARTUP_S"] = startup_s       # the launch's own wait, as a user sets it
    args = [WORKER, str(out), str(TIMEOUT_S), str(LATE_S)]
    port = str(free_port())
    if how == "torchrun":
        torchrun = str(Path(sys.executable).parent / "torchrun")
        return [subprocess.Popen([torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                                  port, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    return [subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env | {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for r in (0, 1)]

def test_a_rank_that_starts_after_the_timeout_still_joins_and_the_timeout_alone_would_not(tmp_path):
    cases = {"agent": ("torchrun", None), "rank0": ("plain", None), "control": ("torchrun", "0")}   # None: the default
    procs = {name: launch(tmp_path / name, how, startup_s) for name, (how, startup_s) in cases.items()}
    logs = {name: "".join(p.communicate(timeout=600)[0] for p in ps) for name, ps in procs.items()}
    got = {name: [json.loads(f.read_text()) if (f := tmp_path / name / f"rank{r}.json").exists() else None
                  for r in (0, 1)] for name in cases}
    for name in ("agent", "rank0"):
        assert got[name] == [{"sum": 3.0}] * 2, (name, got[name], logs[name][-3000:])
    # the control: the same lag against the timeout alone ends the launch at its start, naming the late rank
    error = got["control"][0]["error"]
    assert error.startswith(f"RuntimeError: 1 of 2 ranks started within {TIMEOUT_S} s (not: ranks 1)"), error
    assert "set MTNLG_STARTUP_S (seconds) for every rank" in error                      # and the setting that helps
    assert any(p.returncode != 0 for p in procs["control"])
