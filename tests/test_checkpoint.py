"""Sharded, layout-free checkpoints (mtnlg.checkpoint) across real multi-process layouts.

ONE 8-process torchrun launch (tests/checkpoint_worker.py) runs, in sub-worlds, the library's training path:
TP2 x PP2 x DP2 fp32 (ZeRO-1) for 10 steps saving at 5, then resumes of its step-5 checkpoint at (1,1,1),
(1,4,2), (2,1,4) and (4,2,1) (blocks split 1 + 3): each first checks that every fragment it loaded equals the checkpoint exactly,
then trains steps 6-10, whose losses must equal the original run's within 1e-5. bf16 with dropout on at
TP2 x DP2 (ZeRO-1) resumes at its own layout bit-exactly. Megatron's dropout RNG rules at TP2. Per-rank peak host
memory of init, save, load, evaluation load and export with a model whose full state is several times a rank's.
`mtnlg train` as users run it (a SIGKILL of one rank while it writes a checkpoint, the README's resume at a new
layout, then `mtnlg eval --tp 2` and `mtnlg export` of that run) is in tests/test_train.py, on its shared runs.
"""
import json, os, subprocess, sys
from pathlib import Path
import pytest

from mtnlg import data as D
from mtnlg.train import read_metrics
from mtnlg.checkpoint import latest_checkpoint
from mtnlg import indexed as IX
from conftest import ROOT
from subworld import launch

pytestmark = pytest.mark.slow      # 8-process training launches

ALLOWANCE = 64 * 2 ** 20         # bytes a rank may use above its own sizes (DCP's plans, buffers, allocator slack)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, fixture_data):
    d = tmp_path_factory.mktemp("corpus")
    src = D.Source("shakespeare", str(fixture_data / "corpus/tinyshakespeare/input.txt"), split="blank")
    IX.tokenize_to_indexed([src], d / "shakespeare", workers=1, log=None)
    return str(d / "shakespeare")


def _train_job(name, ranks, run, layout, corpus, **kw):
    s = {"tp": layout[0], "pp": layout[1], "dp": layout[2], "zero": 1, "precision": "fp32", "steps": 10,
         "save_interval": 5, "data": corpus, "seed": 1, "lr": 2e-3, "layers": 4}
    s.update(kw.pop("set", {}))
    return dict(name=name, kind="train", ranks=ranks, run=str(run), set=s, **kw)


LAYOUTS = {"r111": (1, 1, 1), "r142": (1, 4, 2), "r214": (2, 1, 4), "r421": (4, 2, 1)}
PARTITION = {"r421": {"parallel.partition_method": "1,3"}}    # and an uneven split of the 4 blocks
BF16 = {"precision": "bf16", "model.hidden_dropout": 0.1, "model.attention_dropout": 0.1}
MEMORY = {"layers": 8, "hidden": 640, "heads": 8, "vocab": 8192, "seq": 32, "micro_batch": 1, "global_batch": 4,
          "tp": 2, "pp": 2, "dp": 2, "zero": 1, "precision": "fp32", "data": "mock"}


@pytest.fixture(scope="module")
def results(tmp_path_factory, corpus):
    "The one 8-process launch; ({job: result of rank 0}, {job: [result of each rank]}, runs folder)."
    out, runs = tmp_path_factory.mktemp("ck_out"), tmp_path_factory.mktemp("ck_runs")
    base = _train_job("base", [0, 8], runs / "base", (2, 2, 2), corpus)
    resumes = {n: _train_job(n, [0, l[0] * l[1] * l[2]], runs / n, l, corpus, resume=True, verify=True,
                             copy=[str(runs / "base"), 5], set=PARTITION.get(n, {})) for n, l in LAYOUTS.items()}
    bf16 = _train_job("bf16", [4, 4], runs / "bf16", (2, 1, 2), corpus, set=BF16)
    bf16_resume = _train_job("bf16_resume", [4, 4], runs / "bf16_resume", (2, 1, 2), corpus, set=BF16, resume=True,
                             copy=[str(runs / "bf16"), 5])
    dropout = dict(name="dropout", kind="dropout", ranks=[1, 2], set={"tp": 2, "model.hidden_dropout": 0.5,
                                                                       "model.attention_dropout": 0.5})
    memory = dict(name="memory", kind="memory", per_rank=True, ranks=[0, 8], run=str(runs / "memory"), set=MEMORY)
    plan = [[base], [resumes["r142"]], [resumes["r214"]], [resumes["r421"]],
            [resumes["r111"], dropout, bf16], [bf16_resume], [memory]]
    p, got = launch(ROOT / "tests" / "checkpoint_worker.py", plan, out, ports_per_job=2)
    res, per_rank, errors = got["jobs"], got["ranks"], got["errors"]
    assert p.returncode == 0 and not errors, f"worker failed (rc {p.returncode}):\n" + "\n".join(errors) + p.stderr[-3000:]
    return res, per_rank, runs


def _losses(run): return [r["loss"] for r in read_metrics(run)]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_resume_at_new_layout_loads_exactly_and_trains_on(results, name):
    "Fragments loaded at the new layout equal the saved tensors bit for bit; the next 5 losses match (1e-5)."
    res, _, runs = results
    assert res[name]["verified_bad"] == [] and res[name]["verified_pieces"] > 0 and res[name]["loaded_step"] == 5
    base, got = _losses(runs / "base"), _losses(runs / name)
    assert len(base) == len(got) == 10 and got[:5] == base[:5]            # the log reads as one run
    assert got[5:] == pytest.approx(base[5:], rel=1e-5), name
    state = json.loads((latest_checkpoint(runs / name) / "train_state.json").read_text())
    assert [state["layout"][k] for k in ("tp", "pp", "dp")] == list(LAYOUTS[name]) and state["step"] == 10


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
    "bf16, dropout 0.1, TP2 x DP2 with ZeRO-1: the resumed steps 6-10 equal the uninterrupted run exactly."
    _, _, runs = results
    a, b = _losses(runs / "bf16"), _losses(runs / "bf16_resume")
    assert len(a) == len(b) == 10 and b == a


def test_dropout_follows_megatrons_rng_rules(results):
    "Hidden-state dropout masks equal on both TP ranks; attention dropout draws from per-TP-rank streams."
    d = results[0]["dropout"]
    assert 0.3 < d["hidden_drop_fraction"] < 0.7
    assert not d["hidden_masks_differ"] and not d["default_streams_differ"] and d["attention_streams_differ"]


def test_per_rank_memory_follows_the_shard(results):
    "Peak host memory of each rank: its own shard (or fragment) plus one block plus a fixed allowance."
    ranks = results[1]["memory"]
    assert len(ranks) == 8
    for r in ranks:
        block = r["largest_block_bytes"]
        bounds = dict(init=r["shard_bytes"] + block, save=r["fragment_bytes"] + block,
                      load=r["fragment_bytes"] + block, eval_load=r["shard_bytes"] + block)
        if "export" in r: bounds["export"] = 3 * block
        for phase, b in bounds.items():
            assert r[phase] <= b + ALLOWANCE, (phase, r[phase], b + ALLOWANCE)
            assert r["full_state_bytes"] > 1.5 * (b + ALLOWANCE)        # what the old full-state path held
    assert sum("export" in r for r in ranks) == 1
