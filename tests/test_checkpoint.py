"""Sharded, layout-free checkpoints (mtnlg.checkpoint) across real multi-process layouts.

ONE 8-process torchrun launch (tests/checkpoint_worker.py) runs, in sub-worlds, first (each rank's part in a child
forked from it before anything ran there, a fresh heap): per-rank peak host memory of every phase (each measured
alone, with a positive control) on a model whose full state is 8.6x a rank's shard and whose largest tensor is 8x
the allowance, the bytes a load at a new layout reads against the bytes it needs (DCP's reader as the control), and
the bytes each rank hashes to verify the files it reads (each file by one rank: a share of the checkpoint, where one
rank hashing every file is the control). Then the library's training path: TP2 x PP2 x DP2 fp32 (ZeRO-1) for 4 steps
saving at 2, then resumes of its step-2 checkpoint at (1,1,1), (1,4,2), (2,1,4) and (4,2,1) (blocks split 1 + 3):
each checks, once the training run has loaded it, that every fragment it loaded equals the checkpoint exactly (read
back through DCP's own reader), then trains steps 3-4, whose losses must equal the original run's within 1e-5. bf16
with dropout on at TP2 x DP2 (ZeRO-1) resumes at its own layout bit-exactly, and at PP2 x DP2 with every fp32 master
and Adam moment fragment exact. Megatron's dropout RNG rules at TP2.

Then training on 2 ranks (DP2, ZeRO-1): a kill -9 at every point of a save (`COMPLETE` but the old `latest`, in
`mtnlg train` as users run it; a data file half written; every data file but no `.metadata`; `.metadata` but no
`COMPLETE`; during an async save while training went on: resumes forked from one process, tests/kill_worker.py),
each resumed exactly from the last committed checkpoint (the last resume, without a kill, runs to the end); async
saves bit-equal to sync ones; `mtnlg eval` reading a checkpoint while pruning runs. A SIGKILL of one rank of 8, the
README's resume at a new layout, `mtnlg train --resume` after a kill, `mtnlg eval --tp 2` and `mtnlg export` are in
tests/test_train.py.
"""
import json, os, shutil, subprocess, sys, time
from pathlib import Path
import pytest
import torch

from mtnlg import data as D
from mtnlg.train import read_metrics
from mtnlg.checkpoint_folders import latest_checkpoint
from mtnlg import indexed as IX
from conftest import ROOT
from subworld import launch
from kill_worker import folder_state

pytestmark = pytest.mark.slow      # 8-process training launches

MTNLG = str(Path(sys.executable).parent / "mtnlg")
ALLOWANCE = 8 * 2 ** 20          # bytes a rank may use above its own sizes (plans, metadata, allocator slack)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, fixture_data):
    d = tmp_path_factory.mktemp("corpus")
    src = D.Source("shakespeare", str(fixture_data / "corpus/tinyshakespeare/input.txt"), split="blank")
    IX.tokenize_to_indexed([src], d / "shakespeare", workers=1, log=None)
    return str(d / "shakespeare")


STEPS, SAVED = 4, 2         # each run's steps, and the step its resumes start from (2 steps each side of it)
GLOBAL_BATCH = 8            # sequences a step: one micro-batch of 2 a rank at DP4, two at DP2 (a pipeline to fill)


def _train_job(name, ranks, run, layout, corpus, **kw):
    s = {"tp": layout[0], "pp": layout[1], "dp": layout[2], "zero": 1, "precision": "fp32", "steps": STEPS,
         "save_interval": SAVED, "data": corpus, "seed": 1, "lr": 2e-3, "layers": 4, "global_batch": GLOBAL_BATCH}
    s.update(kw.pop("set", {}))
    return dict(name=name, kind="train", ranks=ranks, run=str(run), set=s, **kw)


LAYOUTS = {"r111": (1, 1, 1), "r142": (1, 4, 2), "r214": (2, 1, 4), "r421": (4, 2, 1)}
PARTITION = {"r421": {"parallel.partition_method": "1,3"}}    # and an uneven split of the 4 blocks
BF16 = {"precision": "bf16", "model.hidden_dropout": 0.1, "model.attention_dropout": 0.1}
# full state 481 MiB = 8.6 x a rank's 56 MiB shard; largest tensor (the 32768 x 512 embedding) 64 MiB = 8 x ALLOWANCE
MEMORY = {"layers": 8, "hidden": 512, "heads": 8, "vocab": 32768, "seq": 32, "micro_batch": 1, "global_batch": 4,
          "tp": 2, "pp": 2, "dp": 2, "zero": 1, "precision": "fp32", "data": "mock"}
RELAYOUT = dict(MEMORY, tp=1, pp=2, dp=4)


@pytest.fixture(scope="module")
def launched(tmp_path_factory, corpus):
    """The one 8-process launch: first the memory phases, each rank's in a child forked from it before anything ran
    there (a fresh heap, all of it freed at the child's exit), then the training phases; (`collect`'s dict, runs)."""
    out, runs = tmp_path_factory.mktemp("ck_out"), tmp_path_factory.mktemp("ck_runs")
    memory = dict(name="memory", kind="memory", fork=True, per_rank=True, ranks=[0, 8], run=str(runs / "memory"),
                  set=MEMORY)
    relayout = dict(name="relayout", kind="relayout", fork=True, per_rank=True, ranks=[0, 8], set=RELAYOUT,
                    **{"from": str(runs / "memory")})
    base = _train_job("base", [0, 8], runs / "base", (2, 2, 2), corpus)
    resumes = {n: _train_job(n, [0, l[0] * l[1] * l[2]], runs / n, l, corpus, resume=True, verify=True,
                             copy=[str(runs / "base"), SAVED], set=PARTITION.get(n, {})) for n, l in LAYOUTS.items()}
    bf16 = _train_job("bf16", [4, 4], runs / "bf16", (2, 1, 2), corpus, set=BF16)
    bf16_resume = _train_job("bf16_resume", [4, 4], runs / "bf16_resume", (2, 1, 2), corpus, set=BF16, resume=True,
                             copy=[str(runs / "bf16"), SAVED])
    bf16_relayout = _train_job("bf16_relayout", [4, 4], runs / "bf16_relayout", (1, 2, 2), corpus, set=BF16,
                               resume=True, verify=True, copy=[str(runs / "bf16"), SAVED])
    # phases do not wait for each other: a job reading another's run sits on the ranks that ran it, after it
    dropout = dict(name="dropout", kind="dropout", ranks=[1, 2], set={"tp": 2, "model.hidden_dropout": 0.5,
                                                                       "model.attention_dropout": 0.5})
    plan = [[memory], [relayout], [base], [resumes["r142"]], [resumes["r214"]], [resumes["r421"]],
            [resumes["r111"], dropout, bf16], [bf16_resume], [bf16_relayout]]
    p, got = launch(ROOT / "tests" / "checkpoint_worker.py", plan, out, ports_per_job=2, timeout=1500)
    assert p.returncode == 0 and not got["errors"], \
        f"worker failed (rc {p.returncode}):\n" + "\n".join(got["errors"]) + p.stderr[-3000:]
    return got, runs


@pytest.fixture(scope="module")
def results(launched):
    "The training phases: ({job: result of rank 0}, {job: [result of each rank]}, runs folder)."
    got, runs = launched
    return got["jobs"], got["ranks"], runs


@pytest.fixture(scope="module")
def memory(launched):
    "The memory phases, in processes no `train()` has shaped: {job: [each rank's result]}."
    return launched[0]["ranks"]


def _losses(run): return [r["loss"] for r in read_metrics(run)]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_resume_at_new_layout_loads_exactly_and_trains_on(results, name):
    "Fragments loaded at the new layout equal the saved tensors bit for bit; the next 2 losses match (1e-5)."
    res, _, runs = results
    assert res[name]["verified_bad"] == [] and res[name]["verified_pieces"] > 0 and res[name]["loaded_step"] == SAVED
    base, got = _losses(runs / "base"), _losses(runs / name)
    assert len(base) == len(got) == STEPS and got[:SAVED] == base[:SAVED]       # the log reads as one run
    assert got[SAVED:] == pytest.approx(base[SAVED:], rel=1e-5), name
    state = json.loads((latest_checkpoint(runs / name) / "train_state.json").read_text())
    assert [state["layout"][k] for k in ("tp", "pp", "dp")] == list(LAYOUTS[name]) and state["step"] == STEPS


def test_checkpoint_holds_full_shapes_and_no_bf16_copy(results):
    "One format: the full, unpadded shapes (vocab 50257 at TP2), fp32 masters and both moments, nothing else."
    from mtnlg.checkpoint import checkpoint_shapes
    from mtnlg.config import load_config
    from mtnlg.model import full_shapes
    _, _, runs = results
    have = checkpoint_shapes(latest_checkpoint(runs / "base"))
    want = full_shapes(load_config("tiny").model)
    assert have == {f"{k}/{n}": s for k in ("model", "exp_avg", "exp_avg_sq") for n, s in want.items()}
    assert not list((runs / "base").rglob("full_state*")) and not list((runs / "base").rglob("deepspeed"))


def test_bf16_dropout_same_layout_resume_is_bit_exact(results):
    "bf16, dropout 0.1, TP2 x DP2 with ZeRO-1: the resumed steps 3-4 equal the uninterrupted run exactly."
    _, _, runs = results
    a, b = _losses(runs / "bf16"), _losses(runs / "bf16_resume")
    assert len(a) == len(b) == STEPS and b == a


def test_bf16_resume_at_new_layout_loads_masters_and_moments_exactly(results):
    "bf16 TP2 x DP2 -> PP2 x DP2: every fp32 master and Adam moment fragment equals the checkpoint; it trains on."
    res, _, runs = results
    r = res["bf16_relayout"]
    assert r["verified_bad"] == [] and r["verified_pieces"] > 0 and r["loaded_step"] == SAVED
    got, base = _losses(runs / "bf16_relayout"), _losses(runs / "bf16")
    assert len(got) == STEPS and got[:SAVED] == base[:SAVED] and all(x == x for x in got[SAVED:])   # masks: layout's


def test_dropout_follows_megatrons_rng_rules(results):
    "Hidden-state dropout masks equal on both TP ranks; attention dropout draws from per-TP-rank streams."
    d = results[0]["dropout"]
    assert 0.3 < d["hidden_drop_fraction"] < 0.7
    assert not d["hidden_masks_differ"] and not d["default_streams_differ"] and d["attention_streams_differ"]


def test_the_memory_model_can_show_a_violation(memory):
    "Full state >= 8 x a rank's shard, largest tensor >= 4 x the allowance: a gathered tensor cannot hide."
    for r in memory["memory"]:
        assert r["full_state_bytes"] >= 8 * r["shard_bytes"] and r["largest_tensor_bytes"] >= 4 * ALLOWANCE


def test_per_rank_memory_follows_the_shard(memory):
    "Each phase's peak: what it keeps (+ one slice where it makes one) + the allowance; one whole tensor more fails it."
    ranks = memory["memory"]
    assert len(ranks) == 8
    for r in ranks:
        shard, piece, whole = r["shard_bytes"], r["largest_slice_bytes"], r["largest_tensor_bytes"]
        bounds = dict(init=shard + piece, save=piece, save_async=r["fragment_bytes"],
                      # + DeepSpeed's all-gather of the loaded weights (gloo: one flat buffer of the stage's)
                      load=r["load_moments_bytes"] + shard,
                      eval_load=shard, generation_load=r["generation_bytes"])
        for phase, b in bounds.items():
            assert r[phase] <= b + ALLOWANCE, (phase, r[phase], b + ALLOWANCE)
            # each bound is tight enough that the same phase holding one whole tensor more would fail it
            assert r[phase] + whole > b + ALLOWANCE, (phase, r[phase], b + ALLOWANCE)
        # positive control, measured the same way after every phase: the evaluation load holding one whole tensor
        assert r["control"] > bounds["eval_load"] + ALLOWANCE, (r["control"], bounds["eval_load"] + ALLOWANCE)
        assert r["control"] >= r["eval_load"] + 0.9 * whole            # the measure sees the whole tensor
    exported = [r for r in ranks if "export" in r]
    assert len(exported) == 1
    e = exported[0]                                       # one block's fp32 tensors and their bf16 copies
    assert e["export"] <= 1.5 * e["largest_group_bytes"] + ALLOWANCE < e["full_weights_bytes"]
    assert e["export"] + e["largest_tensor_bytes"] > 1.5 * e["largest_group_bytes"] + ALLOWANCE


def test_loads_read_what_they_need(memory):
    "Bytes read per rank within 1.05x of the bytes asked for (+ the files it verifies), at the same and a new layout."
    for r in memory["memory"]:                        # at the layout it was saved at: each rank verifies its own file
        assert r["load_read_bytes"] <= 1.05 * r["load_asked_bytes"], (r["load_read_bytes"], r["load_asked_bytes"])
    ranks = memory["relayout"]
    assert len(ranks) == 8
    for r in ranks:
        assert r["read_bytes"] <= 1.05 * r["asked_bytes"] + r["hashed_bytes"], (r["read_bytes"], r["asked_bytes"])
        bound = r["moments_bytes"] + r["shard_bytes"] + ALLOWANCE
        assert r["load_new_layout"] <= bound < r["load_new_layout"] + r["largest_tensor_bytes"], \
            (r["load_new_layout"], bound)
    # positive control: the same loads through DCP's own reader read whole stored pieces, once per overlap
    assert max(r["stock_read_bytes"] / r["asked_bytes"] for r in ranks) > 1.05


def test_each_rank_verifies_only_its_share_of_the_files(memory):
    "Every data file hashed by exactly one rank; bytes hashed per rank follow the shard; rank 0 hashing all fails it."
    for job in ("memory", "relayout"):
        ranks = memory[job]
        key = "load_hashed_bytes" if job == "memory" else "hashed_bytes"
        total = ranks[0]["files_bytes"]
        assert sum(r[key] for r in ranks) == total                  # every file verified, each once
        bound = 2 * total / len(ranks)                              # twice an even share
        for r in ranks: assert r[key] <= bound, (job, r[key], bound)
        assert total > bound                                        # positive control: one rank hashing every file
    for r in memory["memory"]:                                      # at the saved layout: its own file, nothing more
        assert r["load_hashed_bytes"] <= 1.05 * r["load_asked_bytes"]


# -------------------------------------------------------------------------------------------------------------
# `mtnlg train` on 2 ranks: kills at every point of a save, async saves, prune while reading

SMALL = ["--preset", "tiny", "--layers", "2", "--dp", "2", "--zero", "1", "--precision", "fp32",
         "--global-batch", "8", "--lr", "2e-3", "--seed", "1", "--save-interval", "2", "--data", "mock", "--no-progress"]


def _mtnlg_train(run, *args, env=None, check=True):
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run([MTNLG, "train", *SMALL, "--out", str(run), *map(str, args)], capture_output=True, text=True,
                       env=e, timeout=900)
    assert not check or p.returncode == 0, f"mtnlg train: {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


RUN_STEPS, COMMITTED = 4, 2     # the small run's steps (saves every 2); the last commit its killed resumes start from
KILLED = COMMITTED + 1           # the save each resume is killed in: the first step after the commit (save_interval 1)
NEXT = {"save_interval": 1}


def _step(n): return f"step{n:08d}"


# (point, MTNLG_INJECT_KILL_IN_SAVE, the step of the save killed, the settings the launch changes): the first kill
# comes after the step-4 save is complete: that launch is also the uninterrupted sync run (copied); the others are
# resumes of the run from step 2, each killed in its very next save (step 3)
KILLS = [("latest", f"{RUN_STEPS}:0:latest", RUN_STEPS, {}), ("data", f"{KILLED}:1:data", KILLED, NEXT),
         ("metadata", f"{KILLED}:0:metadata", KILLED, NEXT), ("complete", f"{KILLED}:0:complete", KILLED, NEXT),
         ("async", f"{KILLED}:1:data", KILLED, dict(NEXT, **{"checkpoint.async": True}))]


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    """One run killed at every point of a save: its first launch (`mtnlg train`), killed once its step-4 checkpoint
    was complete (only `latest` not moved), copied as the sync run; then, in ONE process that forks each launch's 2
    ranks (tests/kill_worker.py), an async run of the same 4 steps (saves at 2 and 4), the other kills, resumes of
    the first run from step 2 killed in their step-3 save, and its last resume, to the end (sync saves again)."""
    root = tmp_path_factory.mktemp("small")
    run, seen = root / "killed", {}
    (point, kill, step, _), *resumed = KILLS
    p = _mtnlg_train(run, "--steps", RUN_STEPS, check=False, env={"MTNLG_INJECT_KILL_IN_SAVE": kill})
    seen[point] = dict(folder_state(run, step), rc=p.returncode, out=p.stdout + p.stderr)
    shutil.copytree(run, root / "sync")                      # steps 1-4 uninterrupted, saves at 2 and 4 complete
    out = root / "kills"
    out.mkdir()
    # the async run: each save's writing starts 2 steps later, its copy 1 s late: after the next optimizer step,
    # unless that step waits for it (as it must)
    cases = [dict(name="async_run", run=str(root / "async"), set={"checkpoint.async": True},
                  env={"MTNLG_INJECT_HOLD_WRITE": "2", "MTNLG_INJECT_SLOW_STAGING": "1"},
                  **{"from": str(root / "sync" / "config.json")})]
    cases += [dict(name=point, step=step, set=changes,
                   env={"MTNLG_INJECT_KILL_IN_SAVE": kill, "MTNLG_INJECT_HOLD_WRITE": "2"})
              for point, kill, step, changes in resumed]
    to_the_end = {"checkpoint.async": False, "save_interval": COMMITTED}                   # sync saves again
    cases += [dict(name="final", step=RUN_STEPS, set=to_the_end, env={})]
    (out / "plan.json").write_text(json.dumps(dict(run=str(run), cases=cases)))
    k = subprocess.run([sys.executable, str(ROOT / "tests" / "kill_worker.py"), str(out / "plan.json"), str(out)],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=1800)
    assert k.returncode == 0, k.stderr[-5000:]
    seen.update({c["name"]: json.loads((out / f"{c['name']}.json").read_text()) for c in cases})
    done = seen.pop("async_run")
    assert done["rc"] == 0, done["out"][-3000:]
    return root, seen


def _stored(ck) -> dict:
    "Every tensor of checkpoint folder `ck`, read whole (a small model)."
    import torch.distributed.checkpoint as dcp
    from mtnlg.checkpoint import CheckpointReader, checkpoint_shapes, _LoadPlanner
    sd = {k: torch.zeros(s) for k, s in checkpoint_shapes(ck).items()}
    dcp.load(sd, storage_reader=CheckpointReader(ck), planner=_LoadPlanner(), no_dist=True)
    return sd


@pytest.mark.parametrize("point", [k for k, *_ in KILLS])
def test_kill_at_every_point_of_a_save_leaves_the_last_commit(small_runs, point):
    "After the kill `latest` still names step 2, the killed save is no checkpoint to resume from; the disk shows where."
    root, seen = small_runs
    s, ref = seen[point], folder_state(root / "sync", RUN_STEPS)
    assert s["rc"] != 0 and s["latest"] == _step(COMMITTED), (s["rc"], s["out"][-3000:])
    files = set(s["files"])
    want = {"data": lambda: "COMPLETE" not in files and ".metadata" not in files and "__1_0.distcp" in files,
            "metadata": lambda: {"__0_0.distcp", "__1_0.distcp", "rng/rank00000.pt", "rng/rank00001.pt"} <= files
                                and ".metadata" not in files and "COMPLETE" not in files,
            "complete": lambda: {".metadata", "train_state.json"} <= files and "COMPLETE" not in files,
            "latest": lambda: "COMPLETE" in files,
            # the step loop went on past the save (step 4 logged) before the held write began and was killed
            "async": lambda: "COMPLETE" not in files and max(s["steps"]) >= KILLED + 1}[point]
    assert want(), (point, s["files"], s["steps"])
    n = min(len(s["losses"]), RUN_STEPS)
    assert s["losses"][:n] == ref["losses"][:n]                 # every step logged before the kill is exact


def test_resumes_after_the_kills_are_exact(small_runs):
    "Each resume starts from step 2 and removes the unfinished folder; the run ends equal to the uninterrupted one."
    root, seen = small_runs
    outs = [seen[k]["out"] for k, *_ in KILLS[1:]] + [seen["final"]["out"]]
    assert all(f"{_step(COMMITTED)} (step {COMMITTED}" in o for o in outs)
    removed = "removed unfinished checkpoint folders: "
    cleaned = [k for (k, _, step, _), o in zip(KILLS, outs) if removed + _step(step) in o]
    assert cleaned == ["data", "metadata", "complete", "async"]          # `latest` left a complete, uncommitted one
    final, ref = seen["final"], folder_state(root / "sync", RUN_STEPS)
    assert final["rc"] == 0 and final["latest"] == _step(RUN_STEPS)
    assert final["steps"] == list(range(1, RUN_STEPS + 1))
    assert final["losses"] == ref["losses"]
    a, b = (_stored(root / r / "checkpoints" / _step(RUN_STEPS)) for r in ("killed", "sync"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_async_saves_equal_sync_saves(small_runs):
    "Saves staged while training went on (copy late, writing held 2 steps) hold the very bytes of sync saves."
    root, _ = small_runs
    assert read_metrics(root / "async") and [m["loss"] for m in read_metrics(root / "async")] == \
        [m["loss"] for m in read_metrics(root / "sync")]
    for step in (_step(COMMITTED), _step(RUN_STEPS)):
        a, b = (root / r / "checkpoints" / step for r in ("async", "sync"))
        sa, sb = _stored(a), _stored(b)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), step
        for r in ("rng/rank00000.pt", "rng/rank00001.pt"):
            x, y = (torch.load(f / r, weights_only=False) for f in (a, b))
            # every stream: torch's, megatron's tracker, and Python's and NumPy's (seeded by `seed_all`)
            assert torch.equal(x["torch"], y["torch"]) and x["tracker"].keys() == y["tracker"].keys()
            assert all(torch.equal(x["tracker"][k], y["tracker"][k]) for k in x["tracker"])
            assert x["python"] == y["python"] and x["numpy"][2:] == y["numpy"][2:]
            assert x["numpy"][0] == y["numpy"][0] and (x["numpy"][1] == y["numpy"][1]).all()
        assert json.loads((a / "train_state.json").read_text()) == json.loads((b / "train_state.json").read_text())
    assert json.loads((root / "async" / "config.json").read_text())["async_checkpoint"] is True


def _weights_run(root, steps=(1, 2, 3)):
    "A run folder of weights-only checkpoints of a small GPT-2-vocabulary model; `latest` is the last."
    from mtnlg.config import ModelConfig, RunConfig
    from mtnlg.model import FullInit
    from mtnlg.checkpoint import write_weights
    cfg = RunConfig(model=ModelConfig(num_layers=1, hidden_size=32, num_heads=2, seq_length=64, hidden_dropout=0,
                                      attention_dropout=0))
    w = FullInit(cfg.model, 0)
    return [write_weights(root / "checkpoints" / f"step{s:08d}", cfg, lambda n: w[n]) for s in steps]


def _wait_for(path, proc, seconds=600):
    for _ in range(seconds * 10):
        if Path(path).exists(): return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def test_prune_while_eval_reads(tmp_path, fixture_data):
    "`mtnlg eval` holds a lease while it evaluates an old checkpoint: pruning skips it; its results outlive it."
    from mtnlg.checkpoint_folders import prune_checkpoints
    run = tmp_path / "run"
    cks = _weights_run(run)
    gate = tmp_path / "gate"
    env = dict(os.environ, OMP_NUM_THREADS="1", MTNLG_INJECT_READ_GATE=str(gate))
    p = subprocess.Popen([MTNLG, "eval", "--checkpoint", str(cks[0]), "--tasks", "lambada", "--shots", "0", "--limit",
                          "2", "--eval-dir", str(fixture_data / "eval"), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _wait_for(f"{gate}.held", p)                                # the reader holds its lease, mid-load
    assert prune_checkpoints(run, keep_last=1) == [cks[1]]
    assert (cks[0] / "COMPLETE").exists() and (cks[0] / "__0_0.distcp").exists()
    gate.touch()
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert list(json.loads(out)) == ["lambada/0shot"]
    assert prune_checkpoints(run, keep_last=1) == [cks[0]]      # the reader is gone: pruned now
    # its results live beside the run's checkpoints, in no folder pruning owns
    assert [p.name for p in (run / "eval" / cks[0].name).glob("*.json")] and not cks[0].exists()
    # positive control: a reader whose lease is taken away loses the checkpoint under it
    gate.unlink()
    Path(f"{gate}.held").unlink()
    code = ("import sys; from mtnlg.config import load_config, ParallelConfig; from mtnlg.topology import "
            "init_distributed; from mtnlg.model import GPT; from mtnlg.checkpoint import load_weights; "
            "cfg = load_config(None, sys.argv[1] + '/config.json', validate=False).model; "
            "init_distributed(ParallelConfig()); load_weights(GPT(cfg), sys.argv[1], cfg)")
    cks = _weights_run(run, (4, 5))
    q = subprocess.Popen([sys.executable, "-c", code, str(cks[0])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    _wait_for(f"{gate}.held", q)
    for lease in (run / "checkpoints" / ".readers").glob("step00000004@*"): lease.unlink()
    assert cks[0] in prune_checkpoints(run, keep_last=1)
    gate.touch()
    _, err = q.communicate(timeout=300)
    assert q.returncode != 0 and not cks[0].exists(), err[-2000:]
