"""Curation's datatrove job arrays spread over the hosts of the multi-host test cluster (tests/multihost.py): the
output equals the local executor's byte for byte (issue 25)."""
import json, os
from pathlib import Path
import pytest

pytestmark = pytest.mark.slow      # the multi-host Slurm cluster and six chained job arrays


def _nodes(cluster, job: str) -> set[str]:
    "The hosts the tasks of job array `job` ran on (`scontrol show job -o`, one line a task)."
    lines = cluster.client("scontrol", "show", "job", "-o", job).stdout.strip().splitlines()
    return {f.split("=", 1)[1] for l in lines for f in l.split() if f.startswith("NodeList=")}


def test_curation_job_arrays_across_two_hosts_equal_the_local_run(multihost_cluster, tmp_path, fixture_data,
                                                                    monkeypatch):
    "Each task asks 3 of a host's 4 CPUs, so a stage's 2 tasks run one a host; outputs equal the local run's."
    from mtnlg.corpus import planted_corpus
    from mtnlg.curation import CurationRun, curate_run
    c = multihost_cluster
    srcs, qc, _ = planted_corpus(tmp_path / "in", fixture_data)
    run = lambda out: CurationRun(srcs, str(tmp_path / out), tasks=2, eval_dir=str(fixture_data / "eval"),
                                  cache_dir=str(tmp_path / "cache"))
    local = curate_run(run("local"), qc, workers=2, log=None)
    for k in [k for k in os.environ if k.startswith("SLURM_")]: monkeypatch.delenv(k)
    for k, v in c.env(OMP_NUM_THREADS="1").items(): monkeypatch.setenv(k, v)     # sbatch finds this cluster
    ids = curate_run(run("slurm"), qc, executor="slurm", partition="debug", time_limit="00:15:00", cpus_per_task=3,
                     mem_per_cpu_gb=1, log=None)
    info = c.wait_job(str(ids["8_report"]), timeout=900)
    out = tmp_path / "slurm"
    logs = "\n".join(f.read_text(errors="replace")[-1500:] for f in out.glob("logs/*/slurm_logs/*.out"))
    assert info["JobState"] == "COMPLETED", logs[-6000:]
    hosts = {name: _nodes(c, str(j)) for name, j in ids.items()}
    assert hosts["1_read"] == {"h1", "h2"}, hosts                  # the two tasks of a stage ran on two hosts
    for s in srcs:
        for f in (f"curated/{s.name}.jsonl", f"indexed/{s.name}.bin", f"indexed/{s.name}.idx"):
            assert (out / f).read_bytes() == (tmp_path / "local" / f).read_bytes(), f
    rep = json.loads((out / "report.json").read_text())
    strip = lambda r: {k: {c_: v for c_, v in d.items() if c_ not in ("path", "prefix")} for k, d in r.items()}
    assert strip(rep["sources"]) == strip(local["sources"])
