"""`mtnlg train` end to end on real tokenized text: 3D layouts against one process, bf16, resume (at the same layout,
and the README's at a new one; every relayout of the library's state is in tests/test_checkpoint.py), a real kill -9
of one rank, non-finite steps, and bad input that fails before any process starts.

Launches are few and shared (module-scoped fixtures): the 3D run is the one killed and resumed (its steps 1-8 before
the kill are an uninterrupted run's), so three 8-process launches, three 1-process runs, one 2-process."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import pytest

from mtnlg import data as D
from mtnlg.train import read_metrics, latest_checkpoint
from mtnlg import indexed as IX

from conftest import ROOT
MTNLG = str(Path(sys.executable).parent / "mtnlg")
STEPS, SAVE = 8, 4
COMMON = ["--preset", "tiny", "--layers", "5", "--global-batch", "16", "--micro-batch", "2", "--lr", "2e-3",
          "--steps", str(STEPS), "--save-interval", str(SAVE), "--set", "eval_interval=4", "--set", "eval_batches=2",
          "--set", "data.split=90,10,0", "--no-progress"]
LAYOUT_3D = ["--tp", "2", "--pp", "2", "--dp", "2"]


def train(out, *args, env=None, timeout=600, check=True):
    "Run `mtnlg train` as a user would; return the CompletedProcess."
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run([MTNLG, "train", *COMMON, "--out", str(out), *map(str, args)], capture_output=True, text=True,
                       env=e, timeout=timeout)
    if check: assert p.returncode == 0, f"mtnlg train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return p


def losses(run, key="loss"): return [r[key] for r in read_metrics(run)]


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
    """fp32 at TP2 x PP2 x DP2 (RUNS/3d), its rank 5 killed (SIGKILL) while it writes the step-8 checkpoint, then
    resumed to step 8: what the kill left ({rc, stderr, partial folder, latest, losses logged}), the resume."""
    run = runs / "3d"
    p = train(run, "--data", corpus, "--precision", "fp32", *LAYOUT_3D, "--steps", "40", check=False,
              env={"MTNLG_INJECT_KILL_IN_SAVE": "8:5"})
    partial = run / "checkpoints" / "step00000008"
    killed = dict(rc=p.returncode, stderr=p.stderr, partial=partial.is_dir(),
                  complete=(partial / "COMPLETE").exists(), latest=latest_checkpoint(run).name, losses=losses(run))
    r = subprocess.run([MTNLG, "train", "--out", str(run), "--resume", "--steps", str(STEPS), "--no-progress"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    return killed, r


@pytest.mark.slow
def test_3d_fp32_trains_like_one_process(runs, killed_3d):
    "The 3D run (steps 5-8 from its resume, exact: the test below) against one process: every logged value."
    assert killed_3d[1].returncode == 0, killed_3d[1].stderr[-3000:]
    ref, par = read_metrics(runs / "ref"), read_metrics(runs / "3d")
    assert [r["step"] for r in par] == list(range(1, STEPS + 1))
    for k in ("loss", "grad_norm", "lr", "global_batch", "tokens"):
        assert [r[k] for r in par] == pytest.approx([r[k] for r in ref], rel=2e-4, abs=1e-6), k
    assert [r["val_loss"] for r in par if "val_loss" in r] == pytest.approx([r["val_loss"] for r in ref if "val_loss" in r], rel=2e-4)
    assert par[-1]["loss"] < par[0]["loss"] - 0.5
    for k in ("tokens_per_s", "tflops_per_gpu", "mem_bytes"): assert par[-1][k] > 0
    assert list((runs / "3d" / "tensorboard").glob("events.out.tfevents.*"))
    assert (runs / "3d" / "plots" / "training.png").stat().st_size > 10_000
    ck = latest_checkpoint(runs / "3d")
    assert ck.name == "step00000008" and (ck / "COMPLETE").exists() and len(list((ck / "rng").glob("rank*.pt"))) == 8
    assert json.loads((ck / "train_state.json").read_text())["consumed_samples"] == STEPS * 16


@pytest.mark.slow
def test_compiled_blocks_train_like_eager(runs, corpus, tmp_path):
    "`compile=true` (torch.compile of every block, the GPU speed path) runs through the same engine, same numbers."
    p = train(tmp_path / "c", "--data", corpus, "--precision", "fp32", "--steps", "2", "--set", "compile=true")
    got, ref = read_metrics(tmp_path / "c"), read_metrics(runs / "ref")[:2]
    for k in ("loss", "grad_norm"): assert [r[k] for r in got] == pytest.approx([r[k] for r in ref], rel=1e-4), k
    assert json.loads((tmp_path / "c" / "config.json").read_text())["compile"] is True


@pytest.mark.slow
def test_kill_one_rank_mid_checkpoint_then_resume_exactly(runs, killed_3d):
    "SIGKILL of rank 5 while it writes the step-8 checkpoint: a clear error, step 4 stays latest, --resume is exact."
    run, (p, r) = runs / "3d", killed_3d
    assert p["rc"] != 0 and len(p["losses"]) <= 8          # the launch ended at the kill: no step after it
    assert "the job failed after step 8" in p["stderr"] and f"--out {run} --resume" in p["stderr"], p["stderr"][-3000:]
    assert p["partial"] and not p["complete"] and p["latest"] == "step00000004"
    assert r.returncode == 0 and "step00000004" in r.stdout + r.stderr, r.stderr[-3000:]
    assert [m["step"] for m in read_metrics(run)] == list(range(1, STEPS + 1))
    # steps 1-8 logged before the kill are an uninterrupted run's: same layout, bit-exact, nothing lost
    assert losses(run) == p["losses"][:STEPS] and len(p["losses"]) >= STEPS
    assert (run / "checkpoints" / "step00000008" / "COMPLETE").exists()   # the partial folder: removed, rewritten


@pytest.mark.slow
def test_readme_relayout_then_eval_and_export(runs, killed_3d, tmp_path, fixture_data):
    "The README's resume at a new layout with only the changed flags; then `mtnlg eval --tp 2` and `mtnlg export`."
    run = tmp_path / "moved"
    shutil.copytree(runs / "3d", run)
    e = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    r = subprocess.run([MTNLG, "train", "--out", str(run), "--steps", "10", "--tp", "2", "--pp", "1", "--dp", "1",
                        "--resume", "--no-progress"], capture_output=True, text=True, env=e, timeout=600)
    assert r.returncode == 0 and "would change the run" not in r.stderr, r.stderr[-3000:]
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["seed"], cfg["steps"], cfg["parallel"]["tp"], cfg["parallel"]["dp"], cfg["optim"]["lr"]) == (1234, 10, 2, 1, 2e-3)
    assert [m["step"] for m in read_metrics(run)] == list(range(1, 11))
    hf, data = tmp_path / "hf", fixture_data / "eval"
    assert subprocess.run([MTNLG, "export", "--checkpoint", str(run), "--out", str(hf), "--dtype", "fp32"],
                          capture_output=True, env=e, timeout=300).returncode == 0
    flags = ["--tasks", "lambada", "--shots", "0", "--limit", "4", "--data", str(data), "--json"]
    a = subprocess.run([MTNLG, "eval", "--checkpoint", str(run), "--tp", "2", *flags, "--out", str(tmp_path / "e2")],
                       capture_output=True, text=True, env=e, timeout=600)
    b = subprocess.run([MTNLG, "eval", "--hf-model", str(hf), *flags, "--out", str(tmp_path / "e1")],
                       capture_output=True, text=True, env=e, timeout=600)
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-3000:] + b.stderr[-3000:]
    assert json.loads(a.stdout) == json.loads(b.stdout)           # TP2 from the checkpoint = its HF export


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, corpus):
    "TP2 x PP2 x DP2 in bf16 (ZeRO-1, fp32 master weights) with a NaN injected into the loss of step 3."
    run = tmp_path_factory.mktemp("bf16") / "run"
    train(run, "--data", corpus, "--precision", "bf16", *LAYOUT_3D, "--steps", "12", env={"MTNLG_INJECT_NONFINITE": "3"})
    return run


@pytest.mark.slow
def test_bf16_3d_loss_falls_and_nonfinite_step_is_skipped(bf16_run, runs):
    m = read_metrics(bf16_run)
    assert [r["step"] for r in m] == list(range(1, 13))
    assert m[2]["skipped"] and m[2]["loss"] is None and m[2]["skipped_total"] == 1
    assert not any(r["skipped"] for r in m[3:]) and m[-1]["skipped_total"] == 1
    assert m[-1]["loss"] < m[0]["loss"] - 1.0 and m[-1]["val_loss"] < m[3]["val_loss"]
    # bf16 follows the fp32 reference closely before the skipped step
    assert [r["loss"] for r in m[:2]] == pytest.approx(losses(runs / "ref")[:2], rel=2e-2)


@pytest.mark.slow
def test_nonfinite_steps_in_a_row_abort(corpus, tmp_path):
    p = train(tmp_path / "nan", "--data", corpus, "--set", "max_nonfinite=2", env={"MTNLG_INJECT_NONFINITE": "2,3"},
              check=False)
    assert p.returncode == 1 and "2 steps in a row had a non-finite loss or gradient (last: step 3)" in p.stderr
    assert [r["skipped"] for r in read_metrics(tmp_path / "nan")] == [False, True, True]


@pytest.mark.parametrize("args,msg", [
    (["--tp", "3", "--dp", "1"], "tp=3 does not divide num_heads=4"),
    (["--dp", "3"], "optim.global_batch: 16 is not divisible by micro_batch x dp = 2 x 3"),
    (["--preset", "gpt5"], "unknown preset 'gpt5'"),
    (["--data", "/nonexistent/prefix"], "/nonexistent/prefix.bin does not exist"),
])
def test_bad_config_fails_before_any_process(tmp_path, args, msg):
    p = train(tmp_path / "bad", *args, check=False)
    assert p.returncode == 2 and msg in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "bad").exists() and "torch.distributed.run" not in p.stderr


@pytest.mark.slow
def test_output_dir_holding_another_run_is_refused(runs, tmp_path):
    p = train(runs / "ref", "--data", "mock", check=False)
    assert p.returncode == 2 and "holds another run; pass --resume" in p.stderr
    p = train(tmp_path / "nothing", "--resume", check=False)
    assert p.returncode == 2 and "holds no run" in p.stderr


@pytest.mark.slow
def test_resume_keeps_the_run_settings_and_refuses_recipe_changes(runs, corpus, tmp_path):
    "--resume starts from the run's saved config: flags not given keep the run's values; a recipe change is refused."
    import shutil
    run = tmp_path / "again"
    shutil.copytree(runs / "ref", run)
    e = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([MTNLG, "train", "--out", str(run), "--resume", "--lr", "1e-3", "--no-progress"],
                       capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode == 2 and "optim.lr 0.002 -> 0.001 would change the run" in p.stderr, p.stderr[-2000:]
    p = subprocess.run([MTNLG, "train", "--out", str(run), "--resume", "--hidden", "128", "--no-progress"],
                       capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode == 2 and "model.hidden_size 64 -> 128" in p.stderr and "torch.distributed.run" not in p.stderr


def test_failure_message_names_the_steps_of_this_launch(tmp_path):
    from mtnlg.train import failure_message, read_metrics
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time_s": 0.1}\n{"step": 2, "time_s": 0.2}\n')
    before = read_metrics(tmp_path)
    assert "failed before its first step" in failure_message(tmp_path, 1, before)   # a resume that died at once
    with open(tmp_path / "metrics.jsonl", "a") as f: f.write('{"step": 3, "time_s": 0.3}\n')
    assert "failed after step 3" in failure_message(tmp_path, 1, before)
    assert "failed after step 3" in failure_message(tmp_path, 1)                      # a first launch
