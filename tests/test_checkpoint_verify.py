"""Every load verifies what it reads (mtnlg.checkpoint_folders.read_through, CheckpointReader): a flipped exponent
bit, zeroed bytes, one flipped bit, a file cut short and a missing file are each refused with one line naming the
file, the checkpoint and an earlier step, by the evaluation/generation load (`load_weights`), export's reads
(`read_tensors`) and score reuse (`verify_checkpoint`); the control: the same damage loads silently through DCP's
own reader, and the undamaged checkpoint loads exactly. `mtnlg train --resume` refuses a flipped exponent bit in
one line (control: the intact copy resumes). Which rank hashes which file follows the shard (the measured bytes per
rank of real 8-rank loads are in tests/test_checkpoint.py). A save into a file system too small for it is refused
before it starts, and a disk that fills mid-write says so in one line."""
import os, shutil
from pathlib import Path
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from mtnlg import eval as ev
from mtnlg.checkpoint import _LoadPlanner, checkpoint_shapes, read_tensors
from mtnlg.checkpoint_folders import CheckpointError, stored_layout, verifiers, verify_checkpoint
from mtnlg.config import EvalError, load_config
from mtnlg.generate import demo_checkpoint

NAME = "blocks.0.mlp.fc1.weight"


def _value_offset(f: Path, ck: Path) -> int:
    "File offset of the first stored value of model/NAME (fp32) in data file `f`."
    md = FileSystemReader(ck).read_metadata()
    idx = next(i for i in md.storage_data if i.fqn == f"model/{NAME}")
    info = md.storage_data[idx]
    fd = os.open(f, os.O_RDONLY)
    try: first, dtype, _ = stored_layout(fd, info.offset, info.length)
    finally: os.close(fd)
    assert dtype == torch.float32
    return first


def _flip(f: Path, at: int, mask: int):
    b = bytearray(f.read_bytes())
    b[at] ^= mask
    f.write_bytes(bytes(b))


def damage(kind: str, ck: Path):
    "Damage data file __0_0.distcp of `ck` the way `kind` says."
    f = ck / "__0_0.distcp"
    at = _value_offset(f, ck)
    if kind == "exponent": _flip(f, at + 3, 0x40)            # little-endian fp32: top byte, exponent's high bit
    elif kind == "zeroed":
        b = bytearray(f.read_bytes())
        b[at:at + 4096] = bytes(4096)
        f.write_bytes(bytes(b))
    elif kind == "one_bit": _flip(f, at + 1, 0x01)             # one mantissa bit of one value
    elif kind == "truncated": os.truncate(f, f.stat().st_size - 1000)
    elif kind == "missing": f.unlink()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    run = demo_checkpoint(tmp_path_factory.mktemp("verify") / "run")
    ck = run / "checkpoints" / "step00000000"
    cfg = load_config(None, ck / "config.json", validate=False).model
    return ck, cfg, read_tensors(ck, [NAME], cfg)[NAME]


def _stock(ck, cfg) -> torch.Tensor:
    "NAME as DCP's own reader loads it (no verification)."
    sd = {f"model/{NAME}": torch.zeros(checkpoint_shapes(ck)[f"model/{NAME}"])}
    dcp.load(sd, storage_reader=FileSystemReader(ck), planner=_LoadPlanner(), no_dist=True)
    return sd[f"model/{NAME}"]


@pytest.mark.parametrize("kind", ["exponent", "zeroed", "one_bit", "truncated", "missing"])
def test_each_damage_is_refused_in_one_line(clean, tmp_path, kind):
    src, cfg, want = clean
    ck = tmp_path / "run" / "checkpoints" / src.name
    shutil.copytree(src.parent.parent, tmp_path / "run")
    scorer, _ = ev.load_model_for_eval(tmp_path / "run", 8)            # control: the copy loads exactly
    assert torch.equal(dict(scorer.fn.__self__.named_parameters())[NAME].detach(), want)
    assert verify_checkpoint(ck) is None
    damage(kind, ck)
    if kind in ("exponent", "zeroed", "one_bit"):                       # control: DCP's reader loads it silently
        got = _stock(ck, cfg)
        assert not torch.equal(got, want)
        if kind == "exponent": assert (got - want).abs().max() > 1e30
        if kind == "one_bit": assert (got != want).sum() == 1
    for load in (lambda: ev.load_model_for_eval(tmp_path / "run", 8), lambda: read_tensors(ck, [NAME], cfg)):
        with pytest.raises((EvalError, CheckpointError)) as e: load()
        msg = str(e.value)
        assert "\n" not in msg and f"{ck / '__0_0.distcp'}" in msg and ck.name in msg and "earlier step" in msg, msg
        what = {"missing": "is missing", "truncated": "bytes where digests.json records"}.get(
            kind, "differs from its sha256")
        assert what in msg, msg
    why = verify_checkpoint(ck)                                         # score reuse's check: the same verdict
    assert why is not None and "__0_0.distcp" in why


def test_each_file_is_hashed_by_one_rank_and_bytes_follow_the_shard():
    "8 ranks loading a checkpoint of 8 files, each rank reading parts of 2-4 of them: hashed bytes per rank bounded."
    size = 100
    reads = [{f"__{w}_0.distcp": size for w in ((r + k) % 8 for k in range(2 + r % 3))} for r in range(8)]
    who = verifiers(reads)
    assert sorted(who) == sorted({n for files in reads for n in files})
    for name, r in who.items(): assert name in reads[r]                  # hashed by a rank that reads it
    per_rank = [sum(size for n, r in who.items() if r == rank) for rank in range(8)]
    total = size * len(who)
    bound = 2 * total / 8                                               # follows the shard (twice the even share)
    assert max(per_rank) <= bound
    # positive control: rank 0 hashing every file, as score reuse did, breaks the bound
    assert total > bound
    same = [{f"__{r}_0.distcp": size, "__0_0.distcp": size} for r in range(8)]    # the layout it was saved at
    assert verifiers(same) == {f"__{r}_0.distcp": r for r in range(8)}           # each rank hashes its own file


@pytest.mark.slow
def test_a_resume_refuses_a_flipped_exponent_bit(tmp_path):
    "`mtnlg train --resume` from a checkpoint with one flipped exponent bit: exit 1 with one line; control: intact."
    import subprocess, sys
    mtnlg = str(Path(sys.executable).parent / "mtnlg")
    args = ["--preset", "tiny", "--layers", "2", "--global-batch", "4", "--data", "mock", "--no-progress",
            "--save-interval", "2", "--out", str(tmp_path / "run")]
    train = lambda *a: subprocess.run([mtnlg, "train", *args, *a], capture_output=True, text=True, timeout=900,
                                      env=dict(os.environ, OMP_NUM_THREADS="1"))
    p = train("--steps", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    ck = tmp_path / "run" / "checkpoints" / "step00000002"
    shutil.copytree(tmp_path / "run", tmp_path / "intact")
    f = ck / "__0_0.distcp"
    _flip(f, _value_offset(f, ck) + 3, 0x40)
    p = train("--resume", "--steps", "4")
    lines = [l for l in p.stderr.splitlines() if "digests.json" in l]
    assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert f"{f} differs from its sha256 in digests.json" in lines[0] and "earlier step" in lines[0]
    args[-1] = str(tmp_path / "intact")                                  # control: the intact copy resumes
    p = train("--resume", "--steps", "4")
    assert p.returncode == 0, p.stderr[-3000:]


def _in_small_disk(folder: Path, code: str, size: str = "2m") -> "subprocess.CompletedProcess":
    "Run Python `code` (argv[1]: `folder`) with `folder` a tmpfs of `size` (a mount namespace of its own)."
    import subprocess, sys
    folder.mkdir(parents=True, exist_ok=True)
    mount = f'd=$1; shift; mount -t tmpfs -o size={size} tmpfs "$d" && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", mount, "-", str(folder),
                           sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.slow
def test_a_full_disk_says_so_in_one_line(tmp_path):
    "A checkpoint written into a 2 MiB file system: one line that names the full disk; control: the same fits 64 MiB."
    code = ("import sys\nfrom mtnlg.checkpoint import write_weights\nfrom mtnlg.config import RunConfig, ModelConfig\n"
            "from mtnlg.model import FullInit\nfrom mtnlg.checkpoint_folders import CheckpointError, check_free_space\n"
            "cfg = RunConfig(model=ModelConfig(num_layers=2, hidden_size=128, num_heads=4, seq_length=64))\n"
            "w = FullInit(cfg.model, 0)\n"
            "try: check_free_space(sys.argv[1], 8 << 20, keep_last=2)\n"
            "except CheckpointError as e: print('before:', e)\n"
            "try: write_weights(sys.argv[1] + '/ck', cfg, lambda n: w[n]); print('written')\n"
            "except CheckpointError as e: print('during:', e)\n")
    small = _in_small_disk(tmp_path / "small", code)
    lines = small.stdout.splitlines()
    assert small.returncode == 0 and len(lines) == 2, small.stderr[-3000:]
    assert lines[0].startswith("before:") and "GB free, but a checkpoint of this run takes" in lines[0]
    assert "keep_last=2 holds 3 checkpoints" in lines[0]
    assert lines[1].startswith("during:") and "the disk is full" in lines[1] and "free space" in lines[1]
    big = _in_small_disk(tmp_path / "big", code, "64m")                  # control: room enough
    assert big.returncode == 0 and big.stdout.splitlines() == ["written"], big.stderr[-3000:]


@pytest.mark.slow
def test_every_rank_refuses_a_damaged_file_alike(tmp_path):
    """`mtnlg eval`'s load at TP2 (2 processes): rank 0 hashes the one file, rank 1 reads its half; both refuse alike.
    Intact, score reuse's check afterwards reads no weight file again on either rank."""
    from conftest import ROOT
    from subworld import launch
    run = demo_checkpoint(tmp_path / "run")
    intact = shutil.copytree(run, tmp_path / "intact")
    ck = run / "checkpoints" / "step00000000"
    f = ck / "__0_0.distcp"
    _flip(f, _value_offset(f, ck) + 3, 0x40)
    plan = [[dict(name=n, kind="damaged", ranks=[0, 2], per_rank=True, run=str(r))] for n, r in
            (("damaged", run), ("intact", intact))]
    (tmp_path / "out").mkdir()
    p, got = launch(ROOT / "tests" / "checkpoint_worker.py", plan, tmp_path / "out", nprocs=2, ports_per_job=2,
                    timeout=600)
    assert p.returncode == 0 and not got["errors"], p.stderr[-3000:] + "\n".join(got["errors"])
    said = [r.get("refused") for r in got["ranks"]["damaged"]]
    assert len(said) == 2 and said[0] == said[1] and f"{f} differs from its sha256" in said[0], said
    intact = got["ranks"]["intact"]
    assert [(r.get("loaded"), r.get("reusable")) for r in intact] == [(True, True)] * 2          # control
    # score reuse after the ranks' load reads no weight file again (rank 0 hashed every file before)
    assert all(r["reuse_read_bytes"] < r["files_bytes"] / 10 for r in intact), intact


@pytest.mark.slow
def test_a_save_that_cannot_fit_is_refused_before_it_writes(tmp_path):
    "`mtnlg train` whose run folder is a 1 MiB file system: its first save refused in one line, nothing written."
    code = ("import subprocess, sys\n"
            "p = subprocess.run([sys.argv[2], 'train', '--preset', 'tiny', '--layers', '2', '--global-batch', '4',"
            " '--data', 'mock', '--no-progress', '--steps', '2', '--save-interval', '2', '--out', sys.argv[1] + '/run'],"
            " capture_output=True, text=True)\n"
            "print(p.returncode)\nprint(p.stderr, file=sys.stderr)\n"
            "import pathlib\nprint(sorted(str(f.relative_to(sys.argv[1])) for f in pathlib.Path(sys.argv[1]).rglob('*.distcp')))\n")
    import subprocess, sys
    folder = tmp_path / "small"
    folder.mkdir()
    mount = 'd=$1; shift; mount -t tmpfs -o size=1m tmpfs "$d" && exec "$@"'
    p = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", mount, "-", str(folder), sys.executable,
                        "-c", code, str(folder), str(Path(sys.executable).parent / "mtnlg")], capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    rc, files = p.stdout.splitlines()[:2]
    said = [l for l in p.stderr.splitlines() if "GB free, but a checkpoint of this run takes" in l]
    assert rc == "1" and files == "[]" and len(said) == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr[-3000:]
