"""Pipelined decoding (mtnlg.generate with `in_flight` batches in the pipeline): at PP4 the tokens equal the
one-batch-at-a-time loop's, greedy and sampled, with batches of prompts of different lengths and rows ending early
at stop strings; and the stages work at the same time (the step intervals of different stages overlap), which they
never do with one batch in flight (the positive control). One 4-process launch runs both paths."""
import json, os, subprocess
import pytest
from conftest import ROOT, LAUNCHER_VARS
from test_pipelined_scoring import stage_overlap

pytestmark = pytest.mark.slow      # a 4-process pipeline

CASES = ("greedy", "sample", "greedy_stop", "sample_stop")


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    "tests/pipelined_decoding_worker.py on 4 processes (PP4) over a random 8-layer model."
    from mtnlg.generate import demo_checkpoint
    from mtnlg.jobs import launch_command
    d = tmp_path_factory.mktemp("pipelined_decoding")
    run = demo_checkpoint(d / "run", seq_length=128, num_layers=8)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1"}
    worker = str(ROOT / "tests" / "pipelined_decoding_worker.py")
    cmd = launch_command([worker, str(run), str(d / "out.json"), "4"], 4)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads((d / "out.json").read_text())


def test_pipelined_tokens_equal_one_batch_at_a_time(decoded):
    import pipelined_decoding_worker as W
    for c in CASES:
        one, piped = decoded[f"{c}_one"], decoded[f"{c}_piped"]
        assert piped["tokens"] == one["tokens"] and piped["finish"] == one["finish"], c
        assert piped["texts"] == one["texts"], c
    assert decoded["until_piped"] == decoded["until_one"]
    # the cases are what they claim: ten prompts of different lengths in five batches (more than PP4 has slots),
    assert len(W.PROMPTS) == 10 and len(W.PROMPTS) // W.BATCH > decoded["pp"]
    assert decoded["sample_one"]["tokens"] != decoded["greedy_one"]["tokens"]
    for c in ("greedy_stop", "sample_stop"):
        one = decoded[f"{c}_one"]
        # batch 0 ends early at a stop string while rows of other batches run to the length, so batches end apart
        assert one["finish"][:2] == ["stop", "stop"] and "length" in one["finish"], (c, one["finish"])
        assert max(map(len, one["tokens"][:2])) < W.NEW
        assert len(one["spans"][0]) < len(decoded[c.replace("_stop", "_one")]["spans"][0])
    # and the comparison can fail: every row differs from every other, so rows or batches mixed up would show
    for c in ("greedy", "sample"):
        assert len({tuple(t) for t in decoded[f"{c}_one"]["tokens"]}) == len(W.PROMPTS), c


def test_stages_busy_at_once_only_when_pipelined(decoded):
    assert sorted(decoded["stage_of_rank"]) == [0, 1, 2, 3]
    for c in CASES:
        one, piped = decoded[f"{c}_one"], decoded[f"{c}_piped"]
        assert stage_overlap(one, decoded) == 0, c                 # one batch in flight: a stage at a time
        assert stage_overlap(piped, decoded) > 0, c
        # each stage ran as many steps as one batch at a time did (pipelining adds no step)
        assert [len(s) for s in piped["spans"]] == [len(s) for s in one["spans"]], c
