"""Every command correct across hosts (issue 25), on the suite's multi-host Slurm cluster (tests/multihost.py).

The placement rule (`mtnlg.jobs.place`) on its own, then real runs on two namespace hosts with gloo: a training job
of TP2 x PP2 x DP2 spread over both hosts equals the one-host run, and when a host is killed mid-run (only its
processes die) Slurm requeues it, the job waits for the host, resumes from the last complete checkpoint and equals
the uninterrupted run. One job's life holds two more requeues: a rank stopped (SIGSTOP) mid-step on h2 ends the job
with a line naming it and its host, and the job requeues itself and resumes; then the time-limit signal makes the
ranks write a checkpoint before the requeue, and the requeued job, given one host, continues at TP2 x PP2 x DP1 with
the losses of the same layout change on one host. `mtnlg eval` and `mtnlg generate` in a 2-node allocation start
exactly 8 and 4 ranks, placed by the rule, with the one-host results; bad input refused before any rank starts; a
study's session listens on loopback unless its ranks span hosts.
The one-host references run outside Slurm on this machine. Runs are tiny (6 steps of the `tiny` preset, fp32).

Slurm holds a requeued job CRED_EXPIRE + 1 s (91 s) before it starts again, and a stopped rank is named after its
watcher's timeout: idle waits, filled with the module's other work. The time-limit test's job is submitted by the
first test of the module and driven by a thread (`TimeLimitJob`) while the next tests run: the two-process checkpoint
test and the one-host reference run during its first run (its stopped rank), the eval/generate (the one-host
eval/generate made meanwhile) and bad-input jobs in its first hold, the layout change's one-host reference during its
second run, the host death test's job in its second hold; its third run (on h1) and the session's job in the host
death's hold. Its own test, last, collects its checks.
"""
import collections, json, os, shutil, subprocess, sys, threading, time
from pathlib import Path
import pytest
from conftest import ROOT, LAUNCHER_VARS
from mtnlg.jobs import PlacementError, place
from mtnlg.train import read_metrics, latest_checkpoint

TRAIN_NB = ROOT / "nbs" / "11_train_job.ipynb"
LAYOUT = dict(tp=2, pp=2, dp=2)
OVERRIDES = dict(LAYOUT, steps=6, save_interval=2, data="mock", global_batch=8, precision="fp32")
HANS = ROOT / "tests" / "data"                      # the committed HANS file: `--tasks hans --eval-dir tests/data`
CLI = "import sys; from mtnlg.cli import main; sys.exit(main())"
PROMPTS = "The first\nA tiny model\n"              # what `mtnlg generate` continues, on one host and in the job


def local_env(**extra) -> dict:
    "This machine's environment without any Slurm job or launcher around it (the one-host references)."
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in LAUNCHER_VARS}
    return dict(env, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", **extra)


def mtnlg(*args, env, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def losses(run) -> dict:
    return {r["step"]: r["loss"] for r in read_metrics(run)}


def assert_losses_equal(run, ref, steps, tol=1e-5):
    got, want = losses(run), losses(ref)
    assert sorted(got) == list(range(1, 7)), got
    bad = {s: (got[s], want[s]) for s in steps if abs(got[s] - want[s]) > tol}
    assert not bad, f"steps whose loss differs from the reference by more than {tol}: {bad}"


def starts(run) -> list[dict]:
    "Each start of the run: its ranks' hostnames, the checkpoint it resumed from, the Slurm job and restart."
    return [json.loads(l) for l in (Path(run) / "hosts.jsonl").read_text().splitlines()]


def blocks(hosts) -> bool:
    "Each host's ranks are consecutive (a host holds whole blocks of ranks, so whole TP groups)."
    firsts = [h for i, h in enumerate(hosts) if i == 0 or hosts[i - 1] != h]
    return len(firsts) == len(set(hosts))


# ---------------------------------------------------------------- the rule on its own (no cluster)

TWO_HOSTS = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "h[1-2]",
             "SLURM_NTASKS_PER_NODE": "4", "SLURM_CPUS_ON_NODE": "4", "SLURM_TASKS_PER_NODE": "4(x2)"}

def test_placement_rule():
    "Ranks in all = tp*pp*dp; ranks a node from the allocation (GPUs, declared tasks, CPUs); TP inside a node."
    p = place(2, 2, 2, env=TWO_HOSTS)
    assert (p.ranks, p.nodes, p.per_node) == (8, 2, 4) and [p.host_of(r) for r in (0, 3, 4, 7)] == ["h1", "h1", "h2", "h2"]
    assert (place(2, 2, env=TWO_HOSTS).nodes, place(2, 2, env=TWO_HOSTS).per_node) == (1, 4)   # generate: one node
    dgx = {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "280", "SLURM_JOB_NODELIST": "dgx[001-280]",
           "SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS_PER_NODE": "1", "SLURM_CPUS_ON_NODE": "256"}
    assert (place(8, 35, 8, env=dgx).nodes, place(8, 35, 8, env=dgx).per_node) == (280, 8)      # the paper's 530B
    # the count a train/eval/generate command asked for before: ranks a node x nodes (issue 25) - now refused
    with pytest.raises(PlacementError, match="needs 4 nodes of 4 ranks .* job 7 has 2 node"):
        place(2, 2, 4, env=TWO_HOSTS)
    with pytest.raises(PlacementError, match="tensor-parallel group of 8 ranks would span nodes of 4"):
        place(8, env=TWO_HOSTS)
    with pytest.raises(PlacementError, match="puts 3 ranks on a node, so a tensor-parallel group of 2"):
        place(2, 3, env=TWO_HOSTS)
    with pytest.raises(PlacementError, match="on 3 nodes: job 7 has 2 node"):
        place(2, 2, 2, nodes=3, env=TWO_HOSTS)
    assert place(4, 2, 2, env={}).nodes == 1                                   # one CPU host outside Slurm takes all


# ---------------------------------------------------------------- runs on the cluster

@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-host run the multi-host runs are compared with: TP2 x PP2 x DP2 on 8 local ranks, checkpoints at
    steps 3 (where `reference_shrunk` changes the layout) and 6 (what eval, generate and the session read)."""
    run = tmp_path_factory.mktemp("reference") / "run"
    p = mtnlg("train", "--tp", 2, "--pp", 2, "--dp", 2, "--steps", 6, "--save-interval", 3, "--global-batch", 8,
              "--precision", "fp32", "--data", "mock", "--out", run, "--no-progress", env=local_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def reference_shrunk(reference, tmp_path_factory):
    "The same layout change on one host: the reference up to step 3, then resumed at TP2 x PP2 x DP1 (4 ranks)."
    run = tmp_path_factory.mktemp("shrunk") / "run"
    shutil.copytree(reference, run)
    for ck in (run / "checkpoints").glob("step*"):
        if int(ck.name[4:]) > 3: shutil.rmtree(ck)
    (run / "checkpoints" / "latest").write_text("step00000003")
    p = mtnlg("train", "--out", run, "--resume", "--dp", 1, "--no-progress", env=local_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def one_host_infer(reference, tmp_path_factory):
    "`mtnlg eval` and `mtnlg generate` of the reference on this machine outside Slurm, one process: the folder."
    one = tmp_path_factory.mktemp("one_host")
    prompts = one / "prompts.txt"
    prompts.write_text(PROMPTS)
    e1 = mtnlg("eval", "--checkpoint", reference, "--tasks", "hans", "--shots", 0, "--limit", 8, "--eval-dir", HANS,
               "--log-samples", "--out", one / "eval", env=local_env())
    g1 = mtnlg("generate", "--checkpoint", reference, "--prompts", prompts, "--max-new-tokens", 6, "--quiet",
               "--out", one / "generate.json", env=local_env())
    assert e1.returncode == 0 and g1.returncode == 0, e1.stderr[-2000:] + g1.stderr[-2000:]
    return one


def cluster_env(cluster, **extra) -> dict:
    return dict(cluster.env(), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", **extra)


def submit_training(cluster, runs, name, *flags, env_extra=None, overrides=None):
    "`mtnlg job submit` of the training notebook on 2 hosts x 4 tasks; (job id, run folder of the job)."
    p = mtnlg("job", "submit", TRAIN_NB, "--nodes", 2, "--gpus-per-node", 0, "--ntasks-per-node", 4,
              "--time", "00:30:00", "--name", name, "--runs-dir", runs, "-p", "overrides",
              json.dumps(overrides or OVERRIDES),
              *flags, env=cluster_env(cluster, **(env_extra or {})), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    job, rd = p.stdout.split("submitted job ")[1].split("; run directory ")
    return job, Path(rd.split()[0])


def job_log(rd, job) -> str:
    f = Path(rd) / f"slurm-{job}.out"
    return f.read_text(errors="replace") if f.exists() else ""


def update_job(cluster, job, *updates):
    """An operator's `scontrol update` of a requeued job. It starts when Slurm's hold after a requeue ends (CRED_EXPIRE
    + 1 s, 91 s here), never earlier. Released at once, a requeued job ended on a loaded CI run before its batch
    script printed a line; the likely cause is the one that hold exists for: an RPC of the ended run that slurmctld
    could not deliver on time, retried once the host answers, reaching the new run."""
    if updates: cluster.client("scontrol", "update", f"jobid={job}", *updates)


# ---------------------------------------------------------------- which checkpoint (two ranks, two views)
# (no cluster: it runs while the time-limit job, submitted here, starts and waits on its stopped rank)

def test_rank0_picks_the_checkpoint_and_every_rank_must_see_it_alike(tmp_path, request):
    "Ranks whose views of the run folder differ: rank 0's pick wins over a stale `latest`; other files are refused."
    time_limit_job_if_selected(request)     # on the cluster meanwhile: its first run waits out a stopped rank
    import torch
    from mtnlg.config import load_config
    from mtnlg.checkpoint import write_weights
    from mtnlg.model import full_shapes
    from subworld import launch
    cfg = load_config("tiny", overrides=dict(vocab=512, pad_vocab_to=128))
    base = tmp_path / "run"
    for step in (2, 4):
        write_weights(base / "checkpoints" / f"step{step:08d}", cfg,
                      lambda n: torch.full(full_shapes(cfg.model)[n], float(step)),
                      dict(step=step, consumed_samples=8 * step))
    views = {}
    for name, change in [("stale_latest", lambda r: (r / "checkpoints" / "latest").write_text("step00000002")),
                         ("other_state", lambda r: (r / "checkpoints/step00000004/train_state.json").write_text("{}")),
                         ("not_there_yet", lambda r: shutil.rmtree(r / "checkpoints/step00000004"))]:
        views[name] = tmp_path / name
        shutil.copytree(base, views[name])
        change(views[name])
    plan = [[{"name": name, "ranks": [0, 2], "per_rank": True, "runs": [str(base), str(views.get(name, base))]}]
            for name in ("same", "stale_latest", "other_state", "not_there_yet")]
    (tmp_path / "out").mkdir()
    p, got = launch(ROOT / "tests" / "resume_worker.py", plan, tmp_path / "out", nprocs=2, timeout=600)
    assert p.returncode == 0 and not got["errors"], p.stderr[-3000:] + "\n".join(got["errors"])
    by_job = {name: sorted(rs, key=lambda r: r["rank"]) for name, rs in got["ranks"].items()}
    assert [r["picked"] for r in by_job["same"]] == ["step00000004"] * 2
    # rank 1 alone would resume step 2 (positive control); it follows rank 0's pick
    assert [(r["alone"], r["picked"]) for r in by_job["stale_latest"]] == [("step00000004", "step00000004"),
                                                                           ("step00000002", "step00000004")]
    for name in ("other_state", "not_there_yet"):             # refused on every rank, naming rank 1
        said = [r.get("refused", "") for r in by_job[name]]
        assert all("ranks 1 (" in m and "see checkpoint" in m and "step00000004 unlike rank 0" in m for m in said), said
        assert [r.get("picked") for r in by_job[name]] == [None, None]


INFER_SCRIPT = """#!/bin/bash
cd {root}
export OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu
MTNLG_HOSTS_FILE={out}/eval-hosts.json {py} -c '{cli}' eval --checkpoint {run} --tp 2 --pp 2 --dp 2 --tasks hans \\
  --shots 0 --limit 8 --eval-dir {data} --log-samples --out {out}/eval > {out}/eval.txt 2>&1; echo "eval rc=$?"
MTNLG_HOSTS_FILE={out}/generate-hosts.json {py} -c '{cli}' generate --checkpoint {run} --tp 2 --pp 2 \\
  --prompts {prompts} --max-new-tokens 6 --quiet --out {out}/generate.json > {out}/generate.txt 2>&1
echo "generate rc=$?"
"""

@pytest.mark.slow
def test_eval_and_generate_in_a_two_node_allocation(multihost_cluster, reference, request, tmp_path):
    "The job's ranks and results against the same on one host outside Slurm, on one process (`one_host_infer`)."
    c = multihost_cluster
    out = tmp_path / "two"
    out.mkdir()
    prompts = out / "prompts.txt"
    prompts.write_text(PROMPTS)
    script = INFER_SCRIPT.format(root=ROOT, out=out, py=sys.executable, cli=CLI, run=reference, data=HANS,
                                 prompts=prompts)
    # when the time-limit test's job runs (submitted before), this one starts in its first hold after a requeue
    job = c.submit(script, "-N", "2", "--ntasks-per-node=4", "--time=00:30:00", name="infer")
    one = request.getfixturevalue("one_host_infer")     # made here while the job waits or runs
    info = c.wait_job(job, timeout=900)
    log = c.output(job, "infer")
    assert info["JobState"] == "COMPLETED" and "eval rc=0" in log and "generate rc=0" in log, (
        log + (out / "eval.txt").read_text()[-2000:] + (out / "generate.txt").read_text()[-2000:])
    # exactly tp*pp*dp = 8 ranks for eval, 4 a host; tp*pp = 4 for generate, all on the first host
    assert json.loads((out / "eval-hosts.json").read_text()) == ["h1"] * 4 + ["h2"] * 4
    assert json.loads((out / "generate-hosts.json").read_text()) == ["h1"] * 4
    assert json.loads((out / "generate.json").read_text()) == json.loads((one / "generate.json").read_text())
    two, ref = (json.loads((d / "eval" / "hans_0shot.json").read_text()) for d in (out, one))
    assert (two["accuracy"], two["correct"], two["n"]) == (ref["accuracy"], ref["correct"], 8)
    ll = lambda r: [x for doc in r["loglikelihoods"] for x in doc]
    assert len(ll(two)) == 16 and max(abs(a - b) for a, b in zip(ll(two), ll(ref))) < 1e-4


BAD_SCRIPT = """#!/bin/bash
cd {root}
export OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu
{py} - <<'EOF'
import contextlib, io, sys
from mtnlg.cli import main
def run(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try: rc = main(list(argv))
        except SystemExit as e: rc = e.code
    print(f"RC {{rc}} {{argv[0]}} " + err.getvalue().strip().replace("\\n", " | "), flush=True)
tiny = ["--steps", "2", "--global-batch", "8", "--data", "mock", "--no-progress"]
run("train", "--tp", "2", "--pp", "2", "--dp", "4", "--out", "{out}/more-nodes", *tiny)
run("train", "--tp", "8", "--heads", "8", "--out", "{out}/tp-too-wide", *tiny)
run("train", "--tp", "2", "--pp", "3", "--out", "{out}/tp-across", *tiny)
run("eval", "--checkpoint", "{run}", "--tp", "2", "--pp", "2", "--dp", "3", "--tasks", "hans", "--eval-dir", "{data}")
run("generate", "--checkpoint", "{run}", "--tp", "2", "--pp", "3", "--prompt", "hi")
from mtnlg.jobs import place, PlacementError
try: place(2, 2, 2, nodes=3)
except PlacementError as e: print(f"RC place {{e}}")
EOF
# a launch made by hand that puts consecutive ranks on different hosts: the ranks refuse it themselves
srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --distribution=cyclic --kill-on-bad-exit=0 \\
  --export=ALL,MASTER_ADDR=h1,MASTER_PORT=$((21000 + SLURM_JOB_ID % 5000)) \\
  bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=4 LOCAL_RANK=$SLURM_LOCALID; exec "$@"' x {py} -c '
import os, sys
from mtnlg.config import ConfigError, ParallelConfig
from mtnlg.topology import init_distributed
try: init_distributed(ParallelConfig(tp=2, dp=2), timeout_s=120)
except ConfigError as e: print("RANK", os.environ["RANK"], "REFUSED", e, flush=True); sys.exit(3)
print("RANK", os.environ["RANK"], "STARTED", flush=True)' > {out}/cyclic.txt 2>&1
echo "cyclic rc=$?"
"""


@pytest.mark.slow
def test_bad_input_is_refused_before_any_rank_starts(multihost_cluster, reference, tmp_path):
    c = multihost_cluster
    job = c.submit(BAD_SCRIPT.format(root=ROOT, py=sys.executable, out=tmp_path, run=reference, data=HANS),
                   "-N", "2", "--ntasks-per-node=4", "--time=00:20:00", name="bad")
    info = c.wait_job(job, timeout=600)
    log = c.output(job, "bad")
    assert info["JobState"] == "COMPLETED", log
    said = [l for l in log.splitlines() if l.startswith("RC ")]
    assert len(said) == 6 and all(l.startswith("RC 2 ") for l in said[:5]), log
    more, wide, across, ev, gen, nodes = said
    assert f"needs 4 nodes of 4 ranks (SLURM_NTASKS_PER_NODE=4: 4 tasks a node, as declared) but job {job} has 2" in more
    assert "a tensor-parallel group of 8 ranks would span nodes of 4 ranks" in wide
    assert "puts 3 ranks on a node, so a tensor-parallel group of 2 would span two nodes" in across
    assert "needs 3 nodes of 4 ranks" in ev and "puts 3 ranks on a node" in gen
    assert f"on 3 nodes: job {job} has 2 node(s)" in nodes
    # one line each, and nothing was started or written
    assert all(" | " not in l for l in said), said
    assert not [p for p in tmp_path.iterdir() if p.name != "cyclic.txt"], list(tmp_path.iterdir())
    cyclic = (tmp_path / "cyclic.txt").read_text()
    assert "cyclic rc=0" not in log and "STARTED" not in cyclic, cyclic
    assert cyclic.count("REFUSED parallel.tp: tensor-parallel groups span hosts (ranks 0-1 on h1, h2") == 4, cyclic


@pytest.mark.slow
def test_training_job_across_two_hosts_equals_the_one_host_run_and_resumes_after_a_host_death(
        multihost_cluster, reference, request, tmp_path):
    """One srun task a rank on 2 hosts x 4: ranks 0-3 on h1, 4-7 on h2, every step's loss the one-host run's. h2 is
    killed after step 3: only its processes die, Slurm requeues the job, which waits for h2, then resumes from the
    last complete checkpoint (step 2) on both hosts and goes on as uninterrupted."""
    c = multihost_cluster
    held = time_limit_job_if_selected(request)
    if held:                    # the time-limit job's second run: this machine makes the layout change's reference
        request.getfixturevalue("reference_shrunk")
        held.wait_held(2)       # this job's first run starts in that job's second hold
    # rank 0 waits after step 3 (checkpoints at 2, 4, 6), so h2 dies at a known point
    job, rd = submit_training(c, tmp_path, "two", "-p", "mode", "srun", "--requeue",
                              env_extra={"MTNLG_INJECT_STALL": "3"})
    run = rd / "train"
    c.wait_until("step 3 of the first run", lambda: (run / "stalled-3").exists(), 900)
    assert latest_checkpoint(run).name == "step00000002" and c.job(job)["JobState"] == "RUNNING"
    (start,) = starts(run)
    assert start["hosts"] == ["h1"] * 4 + ["h2"] * 4 and (start["job"], start["restart"]) == (job, 0)   # 4 a host
    assert "ranks on 2 hosts: h1: ranks 0-3; h2: ranks 4-7" in job_log(rd, job)
    first_run = losses(run)
    assert sorted(first_run) == [1, 2, 3], first_run
    c.kill_host("h2")
    assert c.host_pids("h2") == [] and c.host_pids("h1"), "only h2's processes die"
    # after SlurmdTimeout slurmctld marks h2 down and requeues the job; it waits (2 nodes asked, 1 left)
    c.wait_job(job, until=lambda i: i.get("Restarts") == "1" and i["JobState"] == "PENDING", timeout=180)
    assert c.node_states()["h2"].startswith("down"), c.node_states()
    time.sleep(3)
    assert c.job(job)["JobState"] == "PENDING", "the job must not run while one of its 2 hosts is down"
    c.restart_slurmd("h2")
    # Slurm holds the requeued job CRED_EXPIRE + 1 s (a retried RPC to the dead host lands first): the time-limit
    # job's third run (on h1, given one host) and the session test's job run meanwhile
    if selected(request, SESSION_TEST): request.getfixturevalue("session_job")
    info = c.wait_job(job, timeout=900)
    log = job_log(rd, job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1" and info["NodeList"] == "h[1-2]", log[-3000:]
    first, second = starts(run)
    assert first == start and second["hosts"] == ["h1"] * 4 + ["h2"] * 4, second
    assert (second["restart"], second["resumed_from"], second["job"]) == (1, "step00000002", job)
    assert "restart 1, resume=True" in log
    ref = losses(reference)
    assert all(abs(first_run[s] - ref[s]) <= 1e-5 for s in first_run), (first_run, ref)   # uninterrupted steps 1-3
    assert_losses_equal(run, reference, range(1, 7))           # step 3 again, then 4-6, as uninterrupted
    assert c.node_states() == {"h1": "idle", "h2": "idle"}


SESSION_SCRIPT = """#!/bin/bash
cd {root}
export OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu
{py} - <<'PYEOF'
from mtnlg.session import Session
for tp, pp in ((2, 1), (2, 2)):                  # one node of 2 ranks (this one), then both nodes
    with Session("{run}", tp=tp, pp=pp) as s:
        (lp, greedy), = s.score_pairs([("The first", " step")])
        print("SESSION", tp, pp, s._ranks.listener.address[0], repr(lp), flush=True)
PYEOF
"""

SESSION_TEST = "test_session_listens_on_loopback_unless_its_ranks_are_on_other_hosts"


@pytest.fixture(scope="module")
def session_job(multihost_cluster, reference) -> str:
    "The session test's job, submitted by the first test that asks (the host death test, in its job's hold)."
    return multihost_cluster.submit(SESSION_SCRIPT.format(root=ROOT, py=sys.executable, run=reference), "-N", "2",
                                    "--ntasks-per-node=2", "--time=00:20:00", name="session")


@pytest.mark.slow
def test_session_listens_on_loopback_unless_its_ranks_are_on_other_hosts(multihost_cluster, session_job):
    "In a 2-node allocation of 2 tasks a node: TP2 runs on this node (loopback), TP2 x PP2 on both (the host name)."
    c, job = multihost_cluster, session_job
    info = c.wait_job(job, timeout=900)
    log = c.output(job, "session")
    said = [l.split() for l in log.splitlines() if l.startswith("SESSION ")]
    assert info["JobState"] == "COMPLETED" and len(said) == 2, log[-4000:]
    (_, _, _, one_node, lp1), (_, _, _, two_nodes, lp2) = said
    # the batch host is h1: loopback, then h1's address on the cluster's network; rank 0 reached it both ways
    assert (one_node, two_nodes) == ("127.0.0.1", c.addresses["h1"])
    assert abs(float(lp1) - float(lp2)) < 1e-4


# ---------------------------------------------------------------- one job's three starts (the time-limit signal)

TIME_LIMIT_TEST = "test_a_stopped_rank_then_the_time_limit_signal_requeue_the_job_which_continues_on_one_host"


class TimeLimitJob:
    """The time-limit test's job, driven through its life by a thread from its submission on. Slurm holds it CRED_EXPIRE
    + 1 s after each of its two requeues (see `update_job`); the other tests' jobs of this module run meanwhile (its
    third run waits for the host death test's job, which starts in its second hold, to leave h1)."""
    def __init__(self, cluster, runs):
        self.c = cluster
        self.job, self.rd = submit_training(cluster, runs, "hung", "--requeue",
                                            env_extra={"MTNLG_INJECT_HANG": "3:5", "MTNLG_INJECT_STALL": "3"},
                                            overrides=dict(OVERRIDES, timeout_s=90))
        self.run = self.rd / "train"
        self.held = {1: threading.Event(), 2: threading.Event()}   # requeued the 1st / 2nd time (or the thread ended)
        self.info, self.error = None, None
        self.thread = threading.Thread(target=self._drive, name=f"job {self.job}", daemon=True)
        self.thread.start()

    def wait_held(self, requeue: int):
        "Return once the job is held after its `requeue`-th requeue (or its life ended early: its test says why)."
        self.held[requeue].wait()

    def result(self) -> dict:
        "The job's last `scontrol show job` fields; the first failed check of its life is raised here."
        self.thread.join()
        if self.error is not None: raise self.error
        return self.info

    def _drive(self):
        try: self.info = self._life()
        except BaseException as e:
            self.error = e
            self.c.client("scancel", self.job, check=False)   # the module's next jobs do not wait behind it
        finally:
            for event in self.held.values(): event.set()

    def _life(self) -> dict:
        c, job, rd, run = self.c, self.job, self.rd, self.run
        # 1. the stopped rank: rank 0 never ends step 3 (it waits on rank 5's pipeline), so it does not stall in it
        info = c.wait_job(job, until=lambda i: i.get("Restarts") == "1" and i["JobState"] == "PENDING"
                          or i["JobState"] in ("FAILED", "COMPLETED", "CANCELLED"), timeout=900)
        log = job_log(rd, job)
        assert info.get("Restarts") == "1" and info["JobState"] == "PENDING", log[-4000:]
        self.held[1].set()
        assert (run / "hung-3").read_text() == "h2" and not (run / "stalled-3").exists()   # rank 5 stopped on h2
        said = [l for l in log.splitlines() if "has not answered for" in l]
        assert said and said[0].startswith("mtnlg: rank 5 on host h2 has not answered for"), log[-4000:]
        assert f"requeueing job {job}: it resumes from step00000002" in log, log[-4000:]
        # 2. after Slurm's hold (and the jobs that run in it) it resumes on both hosts; after step 3 the time-limit
        # signal
        ended = lambda: c.job(job)["JobState"] in ("FAILED", "COMPLETED", "CANCELLED")
        c.wait_until("step 3 of the second run", lambda: (run / "stalled-3").exists() or ended(), 1800)
        assert (run / "stalled-3").exists(), f"{c.job(job)}\n{job_log(rd, job)[-4000:]}\n{c.logs(30)}"
        # what Slurm does `grace` seconds before the time limit (sbatch --signal=B:USR1@grace)
        c.client("scancel", "--batch", "--signal=USR1", job)
        info = c.wait_job(job, until=lambda i: i.get("Restarts") == "2" and i["JobState"] == "PENDING"
                          or i["JobState"] in ("FAILED", "COMPLETED", "CANCELLED"), timeout=300)
        assert info.get("Restarts") == "2" and info["JobState"] == "PENDING", job_log(rd, job)[-4000:]
        # 3. the requeued job asks for 2 nodes: an operator lets it run on one, h1 (h2 leaves it: ExcNodeList; the
        # host stays up for the host death test's job, which starts in this hold). NumCPUs too: Slurm keeps the
        # job's 8 CPUs (2 nodes x 4 tasks) after NumNodes=1 NumTasks=4 ('setting min_nodes from 2 to 1'), which
        # only 2 hosts of 4 CPUs hold, and the job would stay PENDING
        update_job(c, job, "NumNodes=1", "NumTasks=4", "NumCPUs=4")
        update_job(c, job, "ExcNodeList=h2")
        self.held[2].set()
        return c.wait_job(job, timeout=1800)


def selected(request, test: str) -> bool:
    "Whether the test named `test` runs in this session."
    return any(getattr(item, "originalname", item.name) == test for item in request.session.items)


def time_limit_job_if_selected(request) -> TimeLimitJob | None:
    "The time-limit test's job (submitted now if not yet) when that test runs in this session, else None."
    if not selected(request, TIME_LIMIT_TEST): return None
    try: return request.getfixturevalue("time_limit_job")
    except pytest.skip.Exception: return None        # no cluster here: the caller's own work goes on without it


@pytest.fixture(scope="module")
def time_limit_job(multihost_cluster, tmp_path_factory):
    "The job of the time-limit test, submitted by the first test that asks (so that its waits overlap theirs)."
    held = TimeLimitJob(multihost_cluster, tmp_path_factory.mktemp("time_limit"))
    yield held
    if held.thread.is_alive():          # its test did not run (a failure stopped the session): end the job and thread
        multihost_cluster.client("scancel", held.job, check=False)
        held.thread.join(300)


@pytest.mark.slow
def test_a_stopped_rank_then_the_time_limit_signal_requeue_the_job_which_continues_on_one_host(
        multihost_cluster, time_limit_job, reference, reference_shrunk):
    """One job's life, three starts on the cluster. 1: rank 5 (on h2) stops itself (SIGSTOP) inside step 3; its
    watcher names it and the job requeues itself. 2: it resumes from step 2 on both hosts; after step 3 comes the
    time-limit signal: the ranks write step 3 (not a save_interval step) and the job requeues itself again. 3: given
    one host, it continues from step 3 at TP2 x PP2 x DP1 with the losses of the same layout change on one host.
    The job was submitted by the first test of this module that asked (`time_limit_job_if_selected`) and driven
    through its life meanwhile (`TimeLimitJob`): here its checks are collected."""
    c, job, rd, run = multihost_cluster, time_limit_job.job, time_limit_job.rd, time_limit_job.run
    info = time_limit_job.result()
    log = job_log(rd, job)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "h1" and info["Restarts"] == "2", log[-3000:]
    assert "Timed out waiting" not in log                   # the heartbeat ended run 1, not a collective's timeout
    # the signal made the ranks write step 3 (not a save_interval step) before the requeue
    assert "stopped by signal SIGUSR1 after step 3 of 6" in log and "time limit in sight" in log, log[-3000:]
    first, second, third = starts(run)
    assert [s["restart"] for s in (first, second, third)] == [0, 1, 2]
    for s in (first, second):                               # torchrun: a host's 4 ranks are one block
        assert collections.Counter(s["hosts"]) == {"h1": 4, "h2": 4} and blocks(s["hosts"]), s
    assert (second["resumed_from"], third["resumed_from"], third["hosts"]) == ("step00000002", "step00000003",
                                                                               ["h1"] * 4)
    (change,) = [json.loads(l) for l in (run / "layout_changes.jsonl").read_text().splitlines()]
    assert (change["before"], change["after"]) == (LAYOUT, dict(LAYOUT, dp=1)) and change["global_batch"] == 8
    assert "layout tp2 x pp2 x dp2 -> tp2 x pp2 x dp1" in log
    assert_losses_equal(run, reference, range(1, 4))           # step 3 after the hang's requeue, as uninterrupted
    assert_losses_equal(run, reference_shrunk, range(4, 7))
