"""`mtnlg job`: papermill runs, the sbatch script as text, and notebook jobs on a REAL Slurm cluster on localhost.

The Slurm tests start a private one-node cluster from Debian's packages (tests/slurm_local.py) once per session,
submit notebook jobs with `mtnlg job submit`, and check what the jobs left: executed notebooks, metrics written
by a 2-process gloo all_reduce launched through `srun`, states, logs, a failure, a requeue that resumes.
"""
import json, os, re, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import ROOT
from mtnlg.jobs import SlurmSpec, JobError, launch_command, notebook_parameters, render_sbatch, wait_job, job_info

# The notebook the Slurm jobs execute. It declares out, nprocs, mode, fail, resume and wait_s; the lead switches
# this to the training notebook (nbs/06_train.ipynb) once it exists, with the parameters it declares.
JOB_NOTEBOOK = ROOT / "tests" / "notebooks" / "gloo_allreduce.ipynb"
TRAIN_NOTEBOOK = ROOT / "nbs" / "11_train_job.ipynb"     # the training job users submit
TRAIN_OVERRIDES = {"tp": 2, "steps": 4, "save_interval": 2, "data": "mock", "global_batch": 8, "precision": "bf16"}
ENV = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")

def mtnlg(*args, env=None, timeout=300):
    "Run the `mtnlg` CLI of this interpreter; the CompletedProcess."
    code = "import sys; from mtnlg.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=env or ENV, timeout=timeout, cwd=ROOT)

# ---------------------------------------------------------------- local runs (no Slurm)

def test_notebook_parameters_read_as_papermill_reads_them(tmp_path):
    "The parameters cell read without papermill (fast: the preflight's first step) gives papermill's answer."
    import papermill
    nbs = [TRAIN_NOTEBOOK, JOB_NOTEBOOK, ROOT / "nbs" / "12_demo_report.ipynb"]
    for nb in nbs: assert notebook_parameters(nb) == papermill.inspect_notebook(str(nb)), nb
    # control: a parameter added to a copy is seen by both readers, and the copy differs from the original
    nb = json.loads(TRAIN_NOTEBOOK.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    cell["source"] = "".join(cell["source"]) + '\nextra: int = 3   # a new one\n'
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    mine = notebook_parameters(tmp_path / "x.ipynb")
    assert mine == papermill.inspect_notebook(str(tmp_path / "x.ipynb")) and mine["extra"]["help"] == "a new one"
    assert mine != notebook_parameters(TRAIN_NOTEBOOK)


def test_run_refuses_unknown_parameter_before_running(tmp_path):
    p = mtnlg("job", "run", JOB_NOTEBOOK, "-p", "nproc", "2", "--runs-dir", tmp_path)
    assert p.returncode == 2, p.stderr
    assert "nproc" in p.stderr and "valid: out (default" in p.stderr and "nprocs (default 2)" in p.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written for a refused run"

def test_run_local_success_and_failure(tmp_path):
    ok = mtnlg("job", "run", JOB_NOTEBOOK, "-p", "nprocs", "2", "--name", "ar", "--runs-dir", tmp_path, "--quiet")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (rd,) = (tmp_path / "ar").iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}", rd.name)
    params = json.loads((rd / "parameters.json").read_text())
    assert params["parameters"] == {"nprocs": 2, "out": str(rd)} and params["kernel"] == "python3"
    m = json.loads((rd / "metrics.json").read_text())
    assert m["world_size"] == 2 and m["allreduce_sum"] == 3.0 and m["backend"] == "gloo"
    assert "Executing Cell" in (rd / "run.log").read_text()
    bad = mtnlg("job", "run", JOB_NOTEBOOK, "-p", "fail", "True", "--name", "bad", "--runs-dir", tmp_path, "--quiet")
    assert bad.returncode == 1 and "deliberate failure" in bad.stdout
    (rd,) = (tmp_path / "bad").iterdir()
    executed = json.loads((rd / "gloo_allreduce.ipynb").read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors and errors[0]["ename"] == "RuntimeError" and "deliberate failure" in errors[0]["evalue"]
    assert json.loads((rd / "result.json").read_text())["ok"] is False

# ---------------------------------------------------------------- the sbatch script as text

def test_render_multinode_gpu_job(tmp_path):
    spec = SlurmSpec(nodes=16, gpus_per_node=8, partition="dgxa100", time="2-00:00:00", account="llm", requeue=True,
                     extra=["--qos=high"])
    s = render_sbatch(JOB_NOTEBOOK, {"nprocs": 8, "mode": "srun"}, spec, tmp_path / "run", job_name="mtnlg-530b",
                      env_activate="module load cuda/12.4 nccl && source /opt/mtnlg/.venv/bin/activate", workdir=tmp_path)
    directives = [l for l in s.splitlines() if l.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=mtnlg-530b", "#SBATCH --nodes=16", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=dgxa100", "#SBATCH --account=llm", "#SBATCH --time=2-00:00:00", "#SBATCH --exclusive",
        f"#SBATCH --chdir={tmp_path}", f"#SBATCH --output={tmp_path}/run/slurm-%j.out", "#SBATCH --open-mode=append",
        "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300", "#SBATCH --qos=high"]
    assert "module load cuda/12.4 nccl && source /opt/mtnlg/.venv/bin/activate" in s
    for k in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_DEVICE_MAX_CONNECTIONS"):
        assert re.search(rf'^export {k}="\${{{k}:-[^}}]+}}"$', s, re.M), k
    assert 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in s
    assert f"mtnlg job run {JOB_NOTEBOOK} --run-dir {tmp_path}/run --kernel python3 -p nprocs 8 -p mode srun -p resume \"$RESUME\" &" in s
    assert "scontrol requeue" in s and 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then RESUME=True; fi' in s
    assert subprocess.run(["bash", "-n"], input=s, text=True).returncode == 0  # valid bash
    # a CPU job has no GPU request and shares its node; without --requeue: --no-requeue and no signal trap
    cpu = render_sbatch(JOB_NOTEBOOK, {}, SlurmSpec(gpus_per_node=0), tmp_path / "r2")
    assert "--gpus-per-node" not in cpu and "--exclusive" not in cpu and "#SBATCH --no-requeue" in cpu
    assert "\ntrap " not in cpu and "--signal" not in cpu and "\ntrap checkpoint_then_requeue USR1" in s
    # USR1 goes on to the ranks (the job's steps, not the batch shell), which checkpoint and stop; then the requeue
    assert 'scancel --signal=USR1 "$SLURM_JOB_ID"' in s and "squeue -h -s -j" in s

def test_render_refuses_bad_input(tmp_path):
    for spec, msg in [(SlurmSpec(time="90min"), "--time '90min'"), (SlurmSpec(nodes=0), "--nodes 0"),
                      (SlurmSpec(time="00:05:00", requeue=True), "requeues itself 300s")]:
        with pytest.raises(JobError, match=re.escape(msg)): render_sbatch(JOB_NOTEBOOK, {}, spec, tmp_path)
    with pytest.raises(JobError, match="does not declare parameter"): render_sbatch(JOB_NOTEBOOK, {"lr": 1}, SlurmSpec(), tmp_path)
    nores = tmp_path / "nores.ipynb"
    nb = json.loads(JOB_NOTEBOOK.read_text())
    nb["cells"][1]["source"] = "out = '.'\n"
    nores.write_text(json.dumps(nb))
    with pytest.raises(JobError, match="declares no `resume` parameter"):
        render_sbatch(nores, {}, SlurmSpec(requeue=True), tmp_path)
    p = mtnlg("job", "submit", JOB_NOTEBOOK, "--time", "1:00", "--dry-run")
    assert p.returncode == 2 and "use HH:MM:SS" in p.stderr

def test_launch_command_multinode_ranks_by_node():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "dgx-a[09-10]", "SLURM_CPUS_ON_NODE": "256"}
    t = launch_command(["train.py", "--tp", "8"], 8, env=env, python="py")
    assert t == ["srun", "--nodes=2", "--kill-on-bad-exit=1", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=256",
                 "bash", "-c", 'trap "" USR1; exec "$@"', "mtnlg-node",
                 "py", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=dgx-a09:20077", "--rdzv-id=77", "--max-restarts=0", "train.py", "--tp", "8"]
    # one node of two: the first, where the rendezvous host is
    assert launch_command(["t.py"], 8, nodes=1, env=env, python="py")[:4] == [
        "srun", "--nodes=1", "--kill-on-bad-exit=1", "--nodelist=dgx-a09"]
    s = launch_command(["train.py"], 8, env=env, mode="srun", python="py")
    assert s[:9] == ["srun", "--nodes=2", "--kill-on-bad-exit=1", "--ntasks=16", "--ntasks-per-node=8", "--cpus-per-task=32",
                     "--distribution=block:block", "--export=ALL,MASTER_ADDR=dgx-a09,MASTER_PORT=20077", "bash"]
    # the per-task wrapper maps Slurm's ids onto torch's env:// variables; block distribution keeps a node's ranks contiguous
    wrapped = subprocess.run(["bash", "-c", s[10], "x", "sh", "-c", "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE"],
                             env={"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16", "SLURM_NODEID": "1",
                                  "PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert wrapped.stdout.split() == ["9", "1", "16", "8"]
    with pytest.raises(JobError, match="has 2 node"): launch_command(["t.py"], 8, nodes=3, env=env)
    with pytest.raises(JobError, match="needs a Slurm allocation"): launch_command(["t.py"], 8, nodes=2, env={})

# ---------------------------------------------------------------- a real Slurm cluster

@pytest.fixture(scope="session")
def slurm(slurm_cluster):
    "The session's one-node Slurm (conftest.py), its config in the environment of the commands run here."
    ENV["SLURM_CONF"] = str(slurm_cluster.conf)
    yield slurm_cluster
    ENV.pop("SLURM_CONF", None)

def submit(runs, name, *flags, notebook=JOB_NOTEBOOK):
    "Submit `notebook` with `mtnlg job submit`; (job id, run dir)."
    p = mtnlg("job", "submit", notebook, "--gpus-per-node", "0", "--name", name, "--runs-dir", runs, *flags)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"submitted job (\d+); run directory (\S+)", p.stdout)
    return m.group(1), Path(m.group(2))

@pytest.fixture(scope="session")
def jobs(slurm, tmp_path_factory):
    "The notebook jobs, all submitted at once so that Slurm runs them back to back."
    runs = tmp_path_factory.mktemp("runs")
    return {
        # one srun task starting torchrun with 2 processes (the job gets 2 CPUs)
        "torchrun": submit(runs, "torchrun", "--cpus-per-task", "2", "--time", "00:10:00", "-p", "nprocs", "2", "-p", "mode", "torchrun"),
        # two srun tasks, one per process (the job gets 2 tasks)
        "srun": submit(runs, "srun", "--ntasks-per-node", "2", "-p", "nprocs", "2", "-p", "mode", "srun"),
        "fail": submit(runs, "fail", "-p", "fail", "True"),
        # the real training notebook: TP2 on two srun tasks, mock data, checkpoints
        "train": submit(runs, "train", "--ntasks-per-node", "2", "--time", "00:10:00", "-p", "nprocs", "2", "-p", "mode", "srun",
                        "-p", "overrides", json.dumps(TRAIN_OVERRIDES), notebook=TRAIN_NOTEBOOK),
    }

def metrics_of(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())

@pytest.mark.slow
@pytest.mark.parametrize("mode", ["torchrun", "srun"])
def test_slurm_job_runs_notebook_with_gloo_through_srun(jobs, mode):
    job, rd = jobs[mode]
    info = wait_job(job, timeout=180)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, (rd / f"slurm-{job}.out").read_text())
    executed = json.loads((rd / "gloo_allreduce.ipynb").read_text())
    assert not [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    injected = [c for c in executed["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and f'mode = "{mode}"' in "".join(injected[0]["source"])
    m = metrics_of(rd)
    assert m["world_size"] == 2 and m["allreduce_sum"] == 3.0 and m["backend"] == "gloo"
    # every rank ran inside this job, in a job step started by srun (not in the batch step)
    assert {r["slurm_job_id"] for r in m["ranks"]} == {job} and {r["slurm_step_id"] for r in m["ranks"]} == {"0"}
    procids = sorted(r["slurm_procid"] for r in m["ranks"])
    assert procids == (["0", "1"] if mode == "srun" else ["0", "0"])  # 2 srun tasks, or 1 task running torchrun
    assert f"mtnlg job {job} on localhost, restart 0, resume=False" in (rd / f"slurm-{job}.out").read_text()

@pytest.mark.slow
def test_slurm_failing_notebook_ends_failed_with_error_in_notebook(jobs):
    job, rd = jobs["fail"]
    info = wait_job(job, timeout=180)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0"
    executed = json.loads((rd / "gloo_allreduce.ipynb").read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert len(errors) == 1 and "deliberate failure requested by the fail parameter" in errors[0]["evalue"]
    assert not (rd / "metrics.json").exists()
    log = mtnlg("job", "logs", job, "-n", "5")
    assert log.returncode == 0 and "FAILED" in log.stdout and "deliberate failure" in log.stdout

@pytest.mark.slow
def test_slurm_status_and_cancel(jobs, tmp_path):
    job, _ = jobs["torchrun"]
    wait_job(job, timeout=180)
    st = mtnlg("job", "status", job)
    assert st.returncode == 0 and re.search(r"JobState: COMPLETED", st.stdout), st.stdout + st.stderr
    assert mtnlg("job", "status").returncode == 0
    long, _ = submit(tmp_path, "cancelme", "-p", "wait_s", "300")
    c = mtnlg("job", "cancel", long)
    assert c.returncode == 0, c.stderr
    assert wait_job(long, timeout=60)["JobState"] == "CANCELLED"
    w = mtnlg("job", "status", long, "--wait")
    assert w.returncode == 1 and "CANCELLED" in w.stdout

@pytest.mark.slow
def test_slurm_requeued_job_resumes(jobs, tmp_path):
    "A requeueable job signalled as at its time limit requeues itself and runs again with resume=True."
    job, rd = submit(tmp_path, "requeue", "--requeue", "--cpus-per-task", "2", "-p", "nprocs", "2", "-p", "wait_s", "120")
    queued, end = time.monotonic() + 900, None        # it waits behind the session's other jobs, then 150 s to start
    while "resume: False" not in ((rd / "run.log").read_text() if (rd / "run.log").exists() else ""):
        state = job_info(job)["JobState"]
        if state == "RUNNING" and end is None: end = time.monotonic() + 150
        assert time.monotonic() < (end or queued) and state in ("PENDING", "RUNNING"), job_info(job)
        time.sleep(0.5)
    # what Slurm does `grace` seconds before the time limit (--signal=B:USR1@grace): signal the batch shell
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, env=ENV)
    info = wait_job(job, timeout=150)
    out = (rd / f"slurm-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, out)
    assert "requeueing" in out and f"restart 1, resume=True" in out
    first, second = rd / "gloo_allreduce.ipynb", rd / "gloo_allreduce.restart1.ipynb"
    assert "resume = False" in first.read_text() and "resume = True" in second.read_text()
    assert "resume: True" in second.read_text() and metrics_of(rd)["allreduce_sum"] == 3.0

@pytest.mark.slow
def test_slurm_training_notebook_job(jobs):
    "The training notebook as a Slurm job: 2 srun tasks train TP2 in bf16, checkpoint, and plot."
    job, rd = jobs["train"]
    info = wait_job(job, timeout=300)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, (rd / f"slurm-{job}.out").read_text()[-3000:])
    executed = json.loads((rd / "11_train_job.ipynb").read_text())
    assert not [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    from mtnlg.train import read_metrics, latest_checkpoint
    m = read_metrics(rd / "train")
    assert [r["step"] for r in m] == [1, 2, 3, 4] and all(r["loss"] > 0 for r in m)
    assert latest_checkpoint(rd / "train").name == "step00000004"
    assert json.loads((rd / "train" / "config.json").read_text())["parallel"]["tp"] == 2
