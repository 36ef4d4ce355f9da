"""Checkpoint folders (mtnlg.checkpoint_folders) and the commit of a save (mtnlg.checkpoint), on one process.

The order of a commit, traced as it happens (tests/commit_order_worker.py: every fsync, rename and mkdir of a sync and
an async save) and checked against what POSIX needs; the same saves with one fsync left out fail the check (the
controls). Pieces that must tile a tensor exactly; a step saved again; leases that survive PID namespaces.
"""
import json, os, shutil, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import ROOT
from mtnlg import checkpoint_folders as F
from mtnlg.checkpoint import dcp_metadata, tiling_fault
from mtnlg.checkpoint_folders import CheckpointError
import torch


def order_faults(trace: list, folder: Path) -> list[str]:
    "What in a traced save breaks POSIX's order: all content and names durable before `COMPLETE`, it before `latest`."
    folder = os.path.realpath(folder)
    content, created, durable, named = {}, {}, {}, {}
    for i, ev in enumerate(trace):
        if ev[0] == "mkdir":
            created[ev[1]] = i
            durable.pop(ev[1], None)
        elif ev[0] == "replace":                          # the content moves with the file; the new name is not durable
            content[ev[2]], created[ev[2]], named[ev[2]] = content.pop(ev[1], None), i, i
            durable.pop(ev[2], None)
        elif ev[2]:                                       # a folder's fsync: the names made in it so far are durable
            for p, t in created.items():
                if os.path.dirname(p) == ev[1] and t < i and p not in durable: durable[p] = i
        else:                                             # a file's fsync: its content (a file written in place)
            content[ev[1]] = i
            created.setdefault(ev[1], i)
    complete, latest = os.path.join(folder, "COMPLETE"), os.path.join(os.path.dirname(folder), "latest")
    if complete not in named or latest not in named: return ["COMPLETE or latest never written"]
    t = named[complete]
    faults = []
    for p in [folder] + [os.path.realpath(q) for q in Path(folder).rglob("*") if q.name != "COMPLETE"]:
        what = os.path.relpath(p, os.path.dirname(folder))
        if not os.path.isdir(p) and not (content.get(p) is not None and content[p] < t):
            faults.append(f"{what}: content not fsync'd before COMPLETE")
        if not durable.get(p, t) < t: faults.append(f"{what}: name not durable before COMPLETE")
    if content.get(complete) is None or not durable.get(complete, named[latest]) < named[latest]:
        faults.append("COMPLETE not durable before latest")
    if content.get(latest) is None or latest not in durable: faults.append("latest not durable")
    return faults


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "commit_order_worker.py"), str(root),
                        str(root / "traces.json")], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    return root, json.loads((root / "traces.json").read_text())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_save_commits_in_the_order_posix_needs(traces, mode):
    root, got = traces
    folder = root / mode / "checkpoints" / "step00000001"
    assert (folder / "COMPLETE").exists() and len(got[mode]) > 20
    assert order_faults(got[mode], folder) == []


@pytest.mark.parametrize("control,fault", [("no_data_fsync", "__0_0.distcp: content not fsync'd before COMPLETE"),
                                           ("no_folder_fsync", "__0_0.distcp: name not durable before COMPLETE")])
def test_the_order_check_fails_with_one_fsync_left_out(traces, control, fault):
    "Positive controls: the same saves with the data file's fsync, or the folder's, not made."
    root, got = traces
    faults = order_faults(got[control], root / control / "checkpoints" / "step00000001")
    assert any(f.endswith(fault) for f in faults), faults


def test_pieces_must_tile_each_tensor_exactly():
    "No gap and no overlap; rows 0-1 and 1-2 of a 4-row tensor (the right number of values) are refused."
    assert tiling_fault((4, 3), [((0, 0), (2, 3)), ((1, 0), (2, 3))]) == "rows 1-2, columns 0-3 written twice"
    assert tiling_fault((4, 3), [((0, 0), (2, 3)), ((2, 0), (2, 2)), ((2, 2), (2, 1))]) is None
    assert tiling_fault((4, 3), [((0, 0), (2, 3)), ((2, 0), (2, 2))]) == "rows 2-4, columns 2-3 missing"
    assert tiling_fault((4, 3), [((0, 0), (4, 3)), ((3, 2), (1, 2))]).endswith("outside")
    assert tiling_fault((6,), [((0,), (4,)), ((3,), (3,))]) == "rows 3-4, columns 0-1 written twice"
    # a ZeRO fragment's three rectangles (partial row, whole rows, partial row) beside a TP column slice
    pieces = [((0, 0), (1, 2)), ((0, 2), (1, 1)), ((1, 0), (2, 1)), ((1, 1), (2, 2)), ((3, 0), (1, 3))]
    assert tiling_fault((4, 3), pieces) is None
    record = lambda off, rows: ("model/w", (4, 3), off, (rows, 3), torch.float32, "__0_0.distcp", 0, 1)
    with pytest.raises(CheckpointError, match="model/w: the ranks' pieces do not tile it"):
        dcp_metadata([record((0, 0), 2), record((1, 0), 2)])
    assert dcp_metadata([record((0, 0), 2), record((2, 0), 2)]).state_dict_metadata["model/w"].size == (4, 3)


def _run(tmp_path, steps=(1, 2)) -> Path:
    run = tmp_path / "run"
    for s in steps:
        F.make_folder(run / "checkpoints" / F.step_tag(s))
        (run / "checkpoints" / F.step_tag(s) / "__0_0.distcp").write_bytes(b"x")
        (run / "checkpoints" / F.step_tag(s) / "COMPLETE").touch()
    return run


def test_a_step_saved_again_respects_readers_and_uncompletes_first(tmp_path, monkeypatch):
    run = _run(tmp_path)
    ck = run / "checkpoints" / "step00000002"
    with F.reading(ck):
        with pytest.raises(CheckpointError, match="a reader holds the earlier save"):
            F.fresh_step_folder(run, 2)
        assert sorted(p.name for p in ck.iterdir()) == ["COMPLETE", "__0_0.distcp"]
    seen, real = [], shutil.rmtree
    monkeypatch.setattr(F.shutil, "rmtree", lambda p, **kw: (seen.append((Path(p) / "COMPLETE").exists()),
                                                             real(p, **kw)))
    assert F.fresh_step_folder(run, 2) == ck and list(ck.iterdir()) == []
    assert seen == [False]                            # no longer a checkpoint before anything of it is deleted


def _reader(ck, *prefix):
    "A process holding a lease on `ck` (started under command `prefix`), once it holds it."
    hold = ("import sys, time; from mtnlg.checkpoint_folders import reading\n"
            "with reading(sys.argv[1]): print('held', flush=True); time.sleep(600)")
    p = subprocess.Popen([*prefix, sys.executable, "-c", hold, str(ck)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


PID_NAMESPACE = ["unshare", "--pid", "--fork", "--kill-child", "--map-root-user", "--mount-proc", "sh", "-c",
                 'echo 3999990 > /proc/sys/kernel/ns_last_pid; "$@"', "-"]     # the reader: process 3999991 there


def test_a_lease_is_alive_while_its_reader_lives_in_any_pid_namespace(tmp_path):
    "A reader in its own PID namespace (its process id names no process here) keeps its checkpoint; killed, it does not."
    run = _run(tmp_path)
    ck = run / "checkpoints" / "step00000001"
    p = _reader(ck, *PID_NAMESPACE)
    try:
        lease, = F.live_leases(ck)
        assert lease.name.split("@")[2] == "3999991"
        assert F.prune_checkpoints(run, keep_last=1) == [] and (ck / "COMPLETE").exists()
        assert not F.alive_by_process(lease)          # control: judged by its process id, it would be pruned
    finally:
        p.kill()                                      # the namespace's processes end with it (--kill-child)
        p.wait()
    for _ in range(600):                              # the kernel ends them after `unshare` itself: wait for it
        if not F.live_leases(ck): break
        time.sleep(0.1)
    assert F.live_leases(ck) == [] and F.prune_checkpoints(run, keep_last=1) == [ck]


def test_commands_read_the_step_their_launcher_resolved(tmp_path):
    "`mtnlg eval` and `generate` pass the step they resolved to every rank; a newer `latest` changes nothing."
    import argparse
    from mtnlg import eval as E, generate as G
    from mtnlg.config import EvalError
    from mtnlg.runs import find_checkpoint, step_of
    run = _run(tmp_path, steps=(1, 2))
    assert step_of(find_checkpoint(run)) == 2 and find_checkpoint(run, 1).name == "step00000001"
    with pytest.raises(EvalError, match=r"no complete checkpoint of step 3 \(the run has \[1, 2\]\)"):
        find_checkpoint(run, 3)
    for mod, extra in ((E, []), (G, ["--prompt", "x"])):
        args = mod.cli_parser(argparse.ArgumentParser()).parse_args(["--checkpoint", str(run), *extra])
        args.step = 1                                    # what the launcher resolved
        argv = mod._rank_argv(args)
        assert argv[argv.index("--step") + 1] == "1"
        again = mod.cli_parser(argparse.ArgumentParser()).parse_args(argv)
        assert find_checkpoint(again.checkpoint, again.step).name == "step00000001"


def _wait_for(path: Path, proc=None):
    "Until file `path` exists (or `proc` ended); a hook's signal, not a time."
    for _ in range(3000):
        if path.exists() or (proc is not None and proc.poll() is not None): return
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


READ = ("import sys; from mtnlg.checkpoint_folders import reading\n"
        "with reading(sys.argv[1]): print('read', flush=True)")


@pytest.mark.parametrize("locks", [True, False])
def test_the_pruners_moment_without_complete_loses_no_leased_step(tmp_path, locks):
    """A pruner stopped after its lease check, a reader arriving, the pruner killed once `COMPLETE` is gone: the reader
    waits and is refused in one line (it never reads a step being pruned). Control (`locks` False: the pruning lock
    cannot be made): the reader passes its check in that moment; then `clean_partial` keeps the leased folder."""
    run = _run(tmp_path, steps=(1, 2, 3))
    ck = run / "checkpoints" / "step00000001"
    if not locks: (run / "checkpoints" / F.READERS / f"{ck.name}.prune").mkdir(parents=True)
    gate, read_gate = tmp_path / "gate", tmp_path / "read_gate"
    prune = "import sys; from mtnlg.checkpoint_folders import prune_checkpoints; prune_checkpoints(sys.argv[1], 1)"
    pruner = subprocess.Popen([sys.executable, "-c", prune, str(run)],
                              env=dict(os.environ, MTNLG_INJECT_PRUNE_GATE=f"{gate}:kill"))
    _wait_for(Path(f"{gate}.held"))                               # leases checked: none; COMPLETE still there
    reader = subprocess.Popen([sys.executable, "-c", READ, str(ck)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, MTNLG_INJECT_READ_GATE=str(read_gate)))
    for _ in range(3000):                                         # its lease is named (before it checks COMPLETE)
        if list((run / "checkpoints" / F.READERS).glob(f"{ck.name}@*")): break
        time.sleep(0.1)
    if not locks: _wait_for(Path(f"{read_gate}.held"), reader)   # control: it passed its check in the moment
    gate.touch()
    pruner.wait(timeout=300)
    assert pruner.returncode == -9 and not (ck / "COMPLETE").exists()      # killed with COMPLETE removed
    if locks:
        out, err = reader.communicate(timeout=300)
        assert reader.returncode == 1 and "read" not in out and "is not a complete checkpoint" in err
        assert F.clean_partial(run) == [ck]                       # no reader: the half-pruned folder goes
    else:
        assert F.clean_partial(run) == [] and (ck / "__0_0.distcp").exists()   # a live lease keeps it
        read_gate.touch()
        out, _ = reader.communicate(timeout=300)
        assert out == "read\n"
        assert F.clean_partial(run) == [ck]                       # let go: removed


def test_a_reader_that_cannot_take_a_lease_is_told(tmp_path, capsys):
    "No `.readers/` can be made (a file there, as on a read-only mount): one line on stderr says so, the read goes on."
    run = _run(tmp_path)
    ck = run / "checkpoints" / "step00000001"
    with F.reading(ck): pass
    assert capsys.readouterr().err == ""                          # control: a lease taken, nothing said
    shutil.rmtree(run / "checkpoints" / F.READERS)
    (run / "checkpoints" / F.READERS).write_text("")
    with F.reading(ck): pass
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no reader's lease on" in err and "may prune this step" in err


def test_latest_accepts_only_a_step_that_exists(tmp_path):
    from mtnlg.config import ConfigError
    run = _run(tmp_path, steps=(1, 2))
    latest = run / "checkpoints" / "latest"
    latest.write_text("step00000001")
    assert F.latest_checkpoint(run).name == "step00000001"       # control: a real step is taken
    for typo in ("step4", "../step00000001", "step00000009"):
        latest.write_text(typo)
        with pytest.raises(ConfigError, match="which is no checkpoint folder of this run"): F.latest_checkpoint(run)
