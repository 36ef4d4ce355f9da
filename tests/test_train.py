"""`mtnlg train` end to end on real tokenized text: 3D layouts against one process, bf16, resume (at the same layout,
and the README's at a new one; every relayout of the library's state is in tests/test_checkpoint.py), a real kill -9
of one rank, non-finite steps, `compile`, and bad input that fails before any process starts.

Launches are few and shared (module-scoped fixtures): the 3D run is the one killed and resumed (its steps 1-4 before
the kill are an uninterrupted run's), so three 8-process launches and one 2-process (`mtnlg eval --tp 2`); the
one-process runs are the reference, the compiled run that then aborts on non-finite steps, and the README's resume
at (1,1,1). Refusals are `mtnlg`'s own entry point called here: they start no process, which is what they check."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import pytest

from mtnlg import data as D
from mtnlg.train import read_metrics, latest_checkpoint
from mtnlg import indexed as IX

from conftest import ROOT
MTNLG = str(Path(sys.executable).parent / "mtnlg")
STEPS, SAVE = 4, 2
COMMON = ["--preset", "tiny", "--layers", "5", "--global-batch", "16", "--micro-batch", "2", "--lr", "2e-3",
          "--steps", str(STEPS), "--save-interval", str(SAVE), "--set", "eval_interval=2", "--set", "eval_batches=2",
          "--set", "data.split=90,10,0", "--no-progress"]
LAYOUT_3D = ["--tp", "2", "--pp", "2", "--dp", "2"]


def train(out, *args, env=None, timeout=600, check=True):
    "Run `mtnlg train` as a user would; return the CompletedProcess."
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run([MTNLG, "train", *COMMON, "--out", str(out), *map(str, args)], capture_output=True, text=True,
                       env=e, timeout=timeout)
    if check: assert p.returncode == 0, f"mtnlg train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return p


def refused(capfd, *argv) -> tuple[int, str]:
    "`mtnlg ARGV` through the console script's entry point, in this process: its exit code and what it printed."
    from mtnlg.cli import main
    capfd.readouterr()
    try: rc = main([str(a) for a in argv])
    except SystemExit as e: rc = e.code
    return rc, capfd.readouterr().err


def losses(run, key="loss"): return [r[key] for r in read_metrics(run)]


@pytest.fixture
def cli_env(monkeypatch):
    "What `mtnlg` sets in its process's environment (notices hidden) is undone after the test."
    for k in ("MTNLG_VERBOSE", "PYTHONWARNINGS"): monkeypatch.setenv(k, os.environ.get(k, ""))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, fixture_data):
    "Tiny Shakespeare, paragraphs as documents, GPT-2 BPE, as a megatron-core indexed dataset prefix."
    d = tmp_path_factory.mktemp("corpus")
    src = D.Source("shakespeare", str(fixture_data / "corpus/tinyshakespeare/input.txt"), split="blank")
    IX.tokenize_to_indexed([src], d / "shakespeare", workers=1, log=None)
    return str(d / "shakespeare")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    "The reference run: fp32 on 1 process (RUNS/ref); the 3D run beside it is `killed_3d`'s (RUNS/3d)."
    root = tmp_path_factory.mktemp("runs")
    train(root / "ref", "--data", corpus, "--precision", "fp32")
    return root


@pytest.fixture(scope="module")
def killed_3d(runs, corpus):
    """fp32 at TP2 x PP2 x DP2 (RUNS/3d), its rank 5 killed (SIGKILL) while it writes the step-4 checkpoint, then
    resumed to step 4: what the kill left ({rc, stderr, partial folder, latest, losses logged}), the resume."""
    run = runs / "3d"
    p = train(run, "--data", corpus, "--precision", "fp32", *LAYOUT_3D, "--steps", "40", check=False,
              env={"MTNLG_INJECT_KILL_IN_SAVE": f"{STEPS}:5"})
    partial = run / "checkpoints" / f"step{STEPS:08d}"
    killed = dict(rc=p.returncode, stderr=p.stderr, partial=partial.is_dir(),
                  complete=(partial / "COMPLETE").exists(), latest=latest_checkpoint(run).name, losses=losses(run))
    r = subprocess.run([MTNLG, "train", "--out", str(run), "--resume", "--steps", str(STEPS), "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    return killed, r


@pytest.mark.slow
def test_3d_fp32_trains_like_one_process(runs, killed_3d):
    "The 3D run (steps 3-4 from its resume, exact: the test below) against one process: every logged value."
    assert killed_3d[1].returncode == 0, killed_3d[1].stderr[-3000:]
    ref, par = read_metrics(runs / "ref"), read_metrics(runs / "3d")
    assert [r["step"] for r in par] == list(range(1, STEPS + 1))
    for k in ("loss", "grad_norm", "lr", "global_batch", "tokens"):
        assert [r[k] for r in par] == pytest.approx([r[k] for r in ref], rel=2e-4, abs=1e-6), k
    vals = [r["val_loss"] for r in par if "val_loss" in r]
    assert len(vals) == 2 and vals == pytest.approx([r["val_loss"] for r in ref if "val_loss" in r], rel=2e-4)
    assert par[-1]["loss"] < par[0]["loss"] - 0.5
    for k in ("tokens_per_s", "tflops_per_gpu", "mem_bytes"): assert par[-1][k] > 0
    assert list((runs / "3d" / "tensorboard").glob("events.out.tfevents.*"))
    assert (runs / "3d" / "plots" / "training.png").stat().st_size > 10_000
    ck = latest_checkpoint(runs / "3d")
    assert ck.name == f"step{STEPS:08d}" and (ck / "COMPLETE").exists()
    assert len(list((ck / "rng").glob("rank*.pt"))) == 8
    assert json.loads((ck / "train_state.json").read_text())["consumed_samples"] == STEPS * 16


@pytest.fixture(scope="module")
def compiled_then_nonfinite(tmp_path_factory, corpus):
    """One process with `compile=true` (torch.compile of every block): steps 1-2 (a checkpoint at 2), then a
    non-finite loss at steps 3 and 4 with max_nonfinite=2, so the run stops: (run folder, the CompletedProcess)."""
    run = tmp_path_factory.mktemp("compiled") / "c"
    p = train(run, "--data", corpus, "--precision", "fp32", "--set", "compile=true", "--set", "max_nonfinite=2",
              env={"MTNLG_INJECT_NONFINITE": "3,4"}, check=False)
    return run, p


@pytest.mark.slow
def test_compiled_blocks_train_like_eager(runs, compiled_then_nonfinite):
    "`compile=true` (the GPU speed path) runs through the same engine, same numbers, and saves its checkpoint."
    run, p = compiled_then_nonfinite
    assert "2 steps in a row had a non-finite" in p.stderr, p.stderr[-3000:]        # its only failure: the injected one
    got, ref = read_metrics(run)[:2], read_metrics(runs / "ref")[:2]
    for k in ("loss", "grad_norm"): assert [r[k] for r in got] == pytest.approx([r[k] for r in ref], rel=1e-4), k
    assert json.loads((run / "config.json").read_text())["compile"] is True
    assert latest_checkpoint(run).name == "step00000002"


@pytest.mark.slow
def test_kill_one_rank_mid_checkpoint_then_resume_exactly(runs, killed_3d):
    "SIGKILL of rank 5 while it writes the step-4 checkpoint: a clear error, step 2 stays latest, --resume is exact."
    run, (p, r) = runs / "3d", killed_3d
    assert p["rc"] != 0 and len(p["losses"]) <= STEPS        # the launch ended at the kill: no step after it
    err = p["stderr"]
    assert f"the job failed after step {STEPS}" in err and f"--out {run} --resume" in err, err[-3000:]
    assert p["partial"] and not p["complete"] and p["latest"] == f"step{SAVE:08d}"
    assert r.returncode == 0 and f"step{SAVE:08d}" in r.stdout + r.stderr, r.stderr[-3000:]
    assert [m["step"] for m in read_metrics(run)] == list(range(1, STEPS + 1))
    # steps 1-4 logged before the kill are an uninterrupted run's: same layout, bit-exact, nothing lost
    assert losses(run) == p["losses"][:STEPS] and len(p["losses"]) >= STEPS
    assert (run / "checkpoints" / f"step{STEPS:08d}" / "COMPLETE").exists()   # the partial folder: removed, rewritten


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")    # export reads in one process
def test_readme_relayout_then_eval_and_export(runs, killed_3d, tmp_path, fixture_data, capfd, cli_env):
    """The README's resume at a new layout with only the changed flags (TP, PP and DP all change: one process), then
    `mtnlg export` and `mtnlg eval --tp 2` (its ranks launched) on the checkpoint it wrote."""
    from mtnlg.cli import main
    run = tmp_path / "moved"
    shutil.copytree(runs / "3d", run)
    e = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    r = subprocess.run([MTNLG, "train", "--out", str(run), "--steps", str(STEPS + 1), "--tp", "1", "--pp", "1",
                        "--dp", "1", "--resume", "--no-progress"], capture_output=True, text=True, env=e, timeout=600)
    assert r.returncode == 0 and "would change the run" not in r.stderr, r.stderr[-3000:]
    cfg = json.loads((run / "config.json").read_text())
    lay = cfg["parallel"]
    assert (lay["tp"], lay["pp"], lay["dp"]) == (1, 1, 1)
    assert (cfg["seed"], cfg["steps"], cfg["optim"]["lr"]) == (1234, STEPS + 1, 2e-3)
    assert [m["step"] for m in read_metrics(run)] == list(range(1, STEPS + 2))
    assert latest_checkpoint(run).name == f"step{STEPS + 1:08d}"
    hf, data = tmp_path / "hf", fixture_data / "eval"
    capfd.readouterr()
    assert main(["export", "--checkpoint", str(run), "--out", str(hf), "--dtype", "fp32", "--no-progress"]) == 0
    flags = ["--tasks", "lambada", "--shots", "0", "--limit", "4", "--data", str(data), "--json"]
    capfd.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--tp", "2", *flags, "--out", str(tmp_path / "e2")]) == 0
    a = capfd.readouterr()
    assert main(["eval", "--hf-model", str(hf), *flags, "--out", str(tmp_path / "e1")]) == 0
    b = capfd.readouterr()
    # TP2 from the checkpoint = its HF export
    assert json.loads(a.out) == json.loads(b.out), a.err[-3000:] + b.err[-3000:]


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, corpus):
    "TP2 x PP2 x DP2 in bf16 (ZeRO-1, fp32 master weights) with a NaN injected into the loss of step 3."
    run = tmp_path_factory.mktemp("bf16") / "run"
    train(run, "--data", corpus, "--precision", "bf16", *LAYOUT_3D, "--steps", "8", "--set", "eval_interval=4",
          env={"MTNLG_INJECT_NONFINITE": "3"})
    return run


@pytest.mark.slow
def test_bf16_3d_loss_falls_and_nonfinite_step_is_skipped(bf16_run, runs):
    m = read_metrics(bf16_run)
    assert [r["step"] for r in m] == list(range(1, 9))
    assert m[2]["skipped"] and m[2]["loss"] is None and m[2]["skipped_total"] == 1
    assert not any(r["skipped"] for r in m[3:]) and m[-1]["skipped_total"] == 1
    assert m[-1]["loss"] < m[0]["loss"] - 1.0 and m[-1]["val_loss"] < m[3]["val_loss"]
    # bf16 follows the fp32 reference closely before the skipped step
    assert [r["loss"] for r in m[:2]] == pytest.approx(losses(runs / "ref")[:2], rel=2e-2)


@pytest.mark.slow
def test_nonfinite_steps_in_a_row_abort(compiled_then_nonfinite):
    "max_nonfinite=2: two non-finite steps in a row stop the run with one line (here the compiled run's steps 3-4)."
    run, p = compiled_then_nonfinite
    assert p.returncode == 1 and "2 steps in a row had a non-finite loss or gradient (last: step 4)" in p.stderr
    assert "resume from" in p.stderr and "step00000002" in p.stderr.split("resume from")[1], p.stderr[-2000:]
    assert [r["skipped"] for r in read_metrics(run)] == [False, False, True, True]


@pytest.mark.parametrize("args,msg", [
    (["--tp", "3", "--dp", "1"], "tp=3 does not divide num_heads=4"),
    (["--dp", "3"], "optim.global_batch: 16 is not divisible by micro_batch x dp = 2 x 3"),
    (["--preset", "gpt5"], "unknown preset 'gpt5'"),
    (["--data", "/nonexistent/prefix"], "/nonexistent/prefix.bin does not exist"),
])
def test_bad_config_fails_before_any_process(tmp_path, args, msg, capfd, cli_env):
    rc, err = refused(capfd, "train", *COMMON, "--out", tmp_path / "bad", *args)
    assert rc == 2 and msg in err, err[-2000:]
    assert not (tmp_path / "bad").exists() and "torch.distributed.run" not in err


@pytest.mark.slow
def test_output_dir_holding_another_run_is_refused(runs, tmp_path, capfd, cli_env):
    rc, err = refused(capfd, "train", *COMMON, "--out", runs / "ref", "--data", "mock")
    assert rc == 2 and "holds another run; pass --resume" in err, err[-2000:]
    rc, err = refused(capfd, "train", *COMMON, "--out", tmp_path / "nothing", "--resume")
    assert rc == 2 and "holds no run" in err, err[-2000:]


@pytest.mark.slow
def test_resume_keeps_the_run_settings_and_refuses_recipe_changes(runs, tmp_path, capfd, cli_env):
    "--resume starts from the run's saved config: flags not given keep the run's values; a recipe change is refused."
    run = tmp_path / "again"
    shutil.copytree(runs / "ref", run)
    rc, err = refused(capfd, "train", "--out", run, "--resume", "--lr", "1e-3", "--no-progress")
    assert rc == 2 and "optim.lr 0.002 -> 0.001 would change the run" in err, err[-2000:]
    rc, err = refused(capfd, "train", "--out", run, "--resume", "--hidden", "128", "--no-progress")
    assert rc == 2 and "model.hidden_size 64 -> 128" in err and "torch.distributed.run" not in err


def test_failure_message_names_the_steps_of_this_launch(tmp_path):
    from mtnlg.train import failure_message, read_metrics
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time_s": 0.1}\n{"step": 2, "time_s": 0.2}\n')
    before = read_metrics(tmp_path)
    assert "failed before its first step" in failure_message(tmp_path, 1, before)   # a resume that died at once
    with open(tmp_path / "metrics.jsonl", "a") as f: f.write('{"step": 3, "time_s": 0.3}\n')
    assert "failed after step 3" in failure_message(tmp_path, 1, before)
    assert "failed after step 3" in failure_message(tmp_path, 1)                      # a first launch
