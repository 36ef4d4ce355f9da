"""Pipelined scoring (mtnlg.eval.pipeline_scorer with `in_flight` micro-batches per pass): at PP4 the scores equal the
one-micro-batch path bit for bit, and the stages work at the same time (forward intervals of different stages
overlap), which they never do with one micro-batch in flight (the positive control)."""
import json, os, subprocess
import pytest
from conftest import ROOT, LAUNCHER_VARS

pytestmark = pytest.mark.slow      # 4-process pipelines


def overlap(a: list, b: list) -> float:
    "Seconds during which some interval of `a` and some interval of `b` both run."
    return sum(max(0.0, min(e0, e1) - max(s0, s1)) for s0, e0 in a for s1, e1 in b)


def stage_overlap(run: dict, scored: dict) -> float:
    "Seconds of overlap summed over every pair of different stages of one replica."
    stage, replica = scored["stage_of_rank"], scored["replica_of_rank"]
    ranks = range(len(stage))
    return sum(overlap(run["spans"][i], run["spans"][j]) for i in ranks for j in ranks
               if i < j and stage[i] != stage[j] and replica[i] == replica[j])


@pytest.fixture(scope="module", params=[(4, 4), (4, 2)], ids=["pp4", "pp2dp2"])
def scored(request, tmp_path_factory):
    "The worker's scores and intervals on `world` processes at `pp` stages."
    from mtnlg.jobs import launch_command
    world, pp = request.param
    out = tmp_path_factory.mktemp("pipelined") / "out.json"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"OMP_NUM_THREADS": "1"}
    cmd = launch_command([str(ROOT / "tests" / "pipelined_scoring_worker.py"), str(out), str(pp)], world)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(out.read_text())


def test_pipelined_scores_equal_one_micro_batch(scored):
    m1, piped = scored["m1"]["ll"], scored["pipelined"]["ll"]
    assert len(m1) == 48 and piped == m1 and scored["unled"]["ll"] == m1          # bitwise: same floats
    # today's shapes (no length buckets) round differently by ~1e-6 only, and the comparison can fail
    assert max(abs(a[0] - b[0]) for a, b in zip(scored["today"]["ll"], m1)) < 1e-4
    assert [x[1] for x in scored["today"]["ll"]] == [x[1] for x in m1]
    assert piped != [(x + 1e-3, g) for x, g in m1]


def test_stages_busy_at_once_only_when_pipelined(scored):
    assert scored["in_flight"] == 2 * scored["pp"] and len(set(scored["stage_of_rank"])) == scored["pp"]
    assert stage_overlap(scored["m1"], scored) == 0 and stage_overlap(scored["today"], scored) == 0
    assert stage_overlap(scored["pipelined"], scored) > 0
    if scored["dp"] == 1:       # each stage ran one forward per batch, as with one in flight, in fewer passes
        assert [len(s) for s in scored["pipelined"]["spans"]] == [len(s) for s in scored["m1"]["spans"]]
