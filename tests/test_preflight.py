"""The preflight every launch runs first (mtnlg.preflight): the exact run a job notebook or `mtnlg train` will run,
checked without torch, refused in one line before a script is written, a job queued or a rank started; the paper
presets' checkpoint interval (mtnlg.resilience). The Slurm test submits to a real one-node Slurm (tests/slurm_local.py)
and shows, as its control, the same mistake reaching the job's first cell when the preflight is skipped."""
import dataclasses, json, os, re, subprocess, sys
from pathlib import Path
import pytest
from conftest import ROOT
from mtnlg.config import PAPER_PRESETS, PRESETS, ConfigError, load_config
from mtnlg.jobs import SlurmSpec, notebook_parameters, submit as submit_without_preflight, wait_job
from mtnlg.preflight import check_allocation, check_data, check_job, job_config
from mtnlg.resilience import Failures, checkpoint_schedule, young_daly

TRAIN_NOTEBOOK = ROOT / "nbs" / "11_train_job.ipynb"
ENV = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
HEAVY = ("torch", "deepspeed", "megatron", "lm_eval", "transformers")
BAD = {"global_batch": 8}          # the old notebook default: below the paper presets' ramp-up start of 32


def mtnlg(*args, env=None, cwd=ROOT):
    "`mtnlg ARGS` in a fresh interpreter; (CompletedProcess, the heavy libraries it imported)."
    code = ("import json, sys\nfrom mtnlg.cli import main\ntry: rc = main()\nexcept SystemExit as e: rc = e.code\n"
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))), file=sys.stderr)\n"
            "sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env or ENV,
                       timeout=300, cwd=cwd)
    return p, json.loads(p.stderr.strip().splitlines()[-1])


def layout_flags(cfg):
    "The `job submit` flags of an allocation that the preset's layout fills: GPU nodes of 8, or one CPU node."
    w = cfg.parallel.world_size
    if w >= 8: return ["--nodes", w // 8, "--gpus-per-node", 8]
    return ["--nodes", 1, "--gpus-per-node", 0, "--ntasks-per-node", w]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_with_the_notebook_defaults_renders_a_loadable_job_or_is_refused(preset, tmp_path):
    cfg = load_config(preset, validate=False)
    p, heavy = mtnlg("job", "submit", TRAIN_NOTEBOOK, "-p", "preset", preset, "--dry-run", "--runs-dir", tmp_path,
                     *layout_flags(cfg))
    assert heavy == [], heavy
    if preset in PAPER_PRESETS:                       # no data named: refused, one line, nothing written
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 2, p.stderr   # + the test's module line
        assert "data.path: no training data given" in p.stderr and not list(tmp_path.iterdir())
        p, heavy = mtnlg("job", "submit", TRAIN_NOTEBOOK, "-p", "preset", preset, "-p", "overrides", '{"data": "mock"}',
                         "--dry-run", "--runs-dir", tmp_path, *layout_flags(cfg))
    assert p.returncode == 0, p.stderr
    # the config shown beside the script is the one the notebook's first cell builds from the job's parameters
    overrides = {"data": "mock"} if preset in PAPER_PRESETS else {}
    assert f"-p preset {preset}" in p.stdout and ("-p overrides" in p.stdout) == bool(overrides)
    shown = json.loads("\n".join(l[4:] for l in p.stdout.splitlines() if l.startswith("#   ")))
    assert shown == dataclasses.asdict(load_config(preset, None, overrides))


def test_a_bad_override_is_refused_at_submit_and_the_control_meets_it_in_the_first_cell():
    "Control: without the preflight, the notebook's config cell is where the same mistake stops the job."
    params = {"preset": "mtnlg-530b", "overrides": {"data": "mock", **BAD}}
    with pytest.raises(ConfigError, match="rampup_batch_start: 32 exceeds global_batch 8"):
        check_job(TRAIN_NOTEBOOK, params, nodes=280)
    cfg, values = job_config(TRAIN_NOTEBOOK, {"preset": "mtnlg-530b", "overrides": {"data": "mock"}})
    assert cfg.optim.global_batch == 1920 and values["overrides"] == {"data": "mock"}   # the override replaced
    # the notebook's config cell, as the job runs it (its code, with the parameters papermill would inject)
    nb = json.loads(TRAIN_NOTEBOOK.read_text())
    cell = "".join(nb["cells"][2]["source"])
    assert "load_config(preset or None, config or None, overrides)" in cell
    ns = dict(preset="mtnlg-530b", config="", out="", overrides=params["overrides"])
    with pytest.raises(ConfigError, match="rampup_batch_start: 32 exceeds global_batch 8"):
        exec(cell.replace("from IPython.display import Image, display\n", "").replace(
            "from mtnlg.train import run_training, read_metrics, latest_checkpoint\n", ""), ns)


def test_layout_must_fill_the_allocation_with_tp_inside_a_node():
    big = load_config("mtnlg-530b", overrides=dict(data="mock"))
    check_allocation(big, 280, 8)                                   # 8 x 35 x 8 = 2,240 = 280 x 8
    with pytest.raises(ConfigError, match=r"does not fill 300 nodes of 8"): check_allocation(big, 300, 8)
    with pytest.raises(ConfigError, match=r"leave GPUs of 280 node\(s\) x 16 idle: .*dp=16.*--nodes 140"):
        check_allocation(big, 280, 16)
    with pytest.raises(ConfigError, match="needs 280 nodes|does not fill|span"):
        check_allocation(big, 140, 8)
    with pytest.raises(ConfigError, match="tensor-parallel group of 8"):
        check_allocation(big, 560, 4)
    check_allocation(big, 300, 8, layout="auto")                    # the planner picks the layout in the job


def test_data_must_be_readable_where_the_job_reads_it(tmp_path):
    (tmp_path / "c.bin").write_bytes(b"x"); (tmp_path / "c.idx").write_bytes(b"x")
    cfg = load_config("tiny", overrides=dict(data="c"))
    check_data(cfg, tmp_path)                                       # relative to the job's working folder
    with pytest.raises(ConfigError, match=r"c\.bin does not exist"): check_data(cfg, tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="no training data given"): check_data(load_config("mtnlg-530b"))
    check_data(load_config("mtnlg-530b", overrides=dict(data="mock")))   # mock, asked for by name


def test_run_folder_state_is_checked(tmp_path):
    params = {"preset": "tiny", "out": str(tmp_path)}
    check_job(TRAIN_NOTEBOOK, params)                                 # a new folder
    (tmp_path / "train").mkdir(); (tmp_path / "train" / "stray.txt").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not empty"): check_job(TRAIN_NOTEBOOK, params)
    with pytest.raises(ConfigError, match="holds no run"): check_job(TRAIN_NOTEBOOK, {**params, "resume": True})
    other = dataclasses.asdict(load_config("tiny", overrides=dict(layers=2, steps=7)))
    (tmp_path / "train" / "config.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match=r"--resume: model.num_layers 2 -> 4 would change the run"):
        check_job(TRAIN_NOTEBOOK, {**params, "resume": True})
    other["model"]["num_layers"] = 4                                  # the same recipe, run longer: resumes
    (tmp_path / "train" / "config.json").write_text(json.dumps(other))
    check_job(TRAIN_NOTEBOOK, {**params, "resume": True})


def test_train_eval_generate_refuse_before_importing_torch(tmp_path):
    p, heavy = mtnlg("train", "--preset", "mtnlg-530b", "--out", tmp_path / "r")
    assert p.returncode == 2 and "no training data given" in p.stderr and heavy == [], p.stderr
    p, heavy = mtnlg("train", "--preset", "tiny", "--data", tmp_path / "missing.json", "--out", tmp_path / "r")
    assert p.returncode == 2 and "missing.json" in p.stderr and heavy == [], p.stderr
    run = tmp_path / "run"; run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {"num_layers": 4, "num_heads": 4}}))
    for cmd in (["eval", "--tasks", "lambada"], ["generate", "--prompt", "x"]):
        p, heavy = mtnlg(*cmd, "--checkpoint", run, "--tp", 3)
        assert p.returncode == 2 and "--tp 3 does not divide the model's 4 heads" in p.stderr and heavy == [], p.stderr
    p, heavy = mtnlg("eval", "--tasks", "lambada", "--checkpoint", tmp_path / "none")
    assert p.returncode == 2 and "no run there" in p.stderr and heavy == [], p.stderr


def test_resilience_interval_is_young_daly_and_the_presets_use_it():
    assert young_daly(50, 100) == pytest.approx(100.0)               # sqrt(2 x 50 x 100)
    for preset, nodes in (("mtnlg-530b", 280), ("gpt3-175b", 128)):
        cfg = load_config(preset)
        s = checkpoint_schedule(cfg, nodes)
        assert cfg.save_interval == s["interval_steps"] and cfg.eval_interval == 4 * cfg.save_interval
        assert cfg.async_checkpoint and s["stall_s"] < s["save_s"]
        # the interval moves as the inputs do: a slower filesystem or more failures
        slow = checkpoint_schedule(cfg, nodes, Failures(storage_gb_per_s=25.0))
        flaky = checkpoint_schedule(cfg, nodes, Failures(node_failures_per_hour=4 * Failures().node_failures_per_hour))
        assert slow["interval_steps"] > s["interval_steps"] > flaky["interval_steps"]
    with pytest.raises(ConfigError, match="storage_gb_per_s"): Failures(storage_gb_per_s=0).validate()


@pytest.mark.slow
def test_slurm_submit_refuses_and_without_it_the_job_meets_the_mistake_after_the_queue(slurm_cluster, tmp_path):
    env = dict(ENV, SLURM_CONF=str(slurm_cluster.conf))
    p, heavy = mtnlg("job", "submit", TRAIN_NOTEBOOK, "--gpus-per-node", 0, "--runs-dir", tmp_path, "-p", "preset",
                     "tiny", "-p", "overrides", json.dumps({"rampup_batch_start": 64}), env=env)
    assert p.returncode == 2 and "rampup_batch_start: 64 exceeds global_batch 16" in p.stderr, p.stderr
    assert heavy == [] and not list(tmp_path.iterdir())              # no script written, nothing queued
    # control: the same job submitted without submit's preflight queues and waits for its nodes; inside it, `mtnlg
    # job run` (the script's command) meets the mistake, after the queue, before the notebook starts
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    try:
        job, rd = submit_without_preflight(TRAIN_NOTEBOOK, {"preset": "tiny", "overrides": {"rampup_batch_start": 64}},
                                           SlurmSpec(gpus_per_node=0, time="00:10:00"),
                                           runs_root=tmp_path)
        info = wait_job(job, timeout=300)
    finally: os.environ.pop("SLURM_CONF", None)
    log = (rd / f"slurm-{job}.out").read_text()
    assert info["JobState"] == "FAILED" and "rampup_batch_start: 64 exceeds global_batch 16" in log, (info, log)
    assert not (rd / "11_train_job.ipynb").exists()                  # no rank, no kernel started


def test_plan_prints_the_paper_jobs_interval_loss_and_overhead(capsys):
    from mtnlg.cli import main
    assert main(["plan", "--preset", "mtnlg-530b", "--tp", "8", "--pp", "35", "--nodes", "280"]) == 0
    out = capsys.readouterr().out
    assert "checkpoints: every 56 steps" in out and re.search(r"loses about \d+ min", out) and "overhead 3.3%" in out
    assert main(["plan", "--preset", "mtnlg-530b", "--tp", "8", "--pp", "35", "--nodes", "280", "--storage-gbps", "25"]) == 0
    assert "checkpoints: every 108 steps" in capsys.readouterr().out        # the bandwidth the user sets
    assert main(["plan", "--preset", "gpt3-1.3b", "--tp", "1", "--pp", "1", "--nodes", "1", "--gpus-per-node", "1"]) == 0
    assert "checkpoints:" not in capsys.readouterr().out                    # control: not a paper preset


def test_a_start_up_wait_that_is_not_seconds_is_refused_at_submit_and_a_number_passes(tmp_path):
    "Every rank reads $MTNLG_STARTUP_S at its start (mtnlg.topology.launch_store): a bad one is refused before queueing."
    flags = ("job", "submit", TRAIN_NOTEBOOK, "-p", "preset", "tiny", "--dry-run", "--runs-dir", tmp_path,
             *layout_flags(load_config("tiny", validate=False)))
    p, heavy = mtnlg(*flags, env=ENV | {"MTNLG_STARTUP_S": "half an hour"})
    assert p.returncode == 2 and heavy == [] and not list(tmp_path.iterdir()), p.stderr
    assert "MTNLG_STARTUP_S='half an hour': must be seconds >= 0" in p.stderr, p.stderr
    p, _ = mtnlg(*flags, env=ENV | {"MTNLG_STARTUP_S": "3600"})          # control: a number of seconds
    assert p.returncode == 0, p.stderr
