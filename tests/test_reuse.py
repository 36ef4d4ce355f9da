"""A stored score is reused only for weights verified by content, and by the loads' own check: the evaluation's load
verifies each weight file it reads against the checkpoint's `digests.json` (on the rank that reads it), so reuse
reads no weight file again; a file changed since is hashed again (the control). Another checkpoint's file of the
same shapes copied over one (which keeps the fingerprint, made from the digests) is refused at load in one line,
and no score is reused for it."""
import shutil
import pytest
from conftest import DATA
from mtnlg import eval as ev
from mtnlg.config import EvalError
from mtnlg.generate import demo_checkpoint
from mtnlg.results import reusable
from mtnlg.runs import checkpoint_identity, find_checkpoint, run_tokenizer


def score(run, out) -> dict:
    "The 1-shot PIQA result of `run` (one process, 6 documents), stored in or reused from `out`."
    scorer, ck = ev.load_model_for_eval(run, 8)
    model = checkpoint_identity(ck, run)
    return ev.evaluate(scorer, "piqa", [1], 6, out, DATA / "eval", 1234, tokenizer=run_tokenizer(run), log=None,
                       model=model, keep_loglikelihoods=True)[0]


def _read() -> int:
    return int(next(l for l in open("/proc/self/io") if l.startswith("rchar")).split()[1])


def test_a_swapped_weight_file_is_refused_and_never_reused(tmp_path):
    run, other = demo_checkpoint(tmp_path / "run"), demo_checkpoint(tmp_path / "other", seed=1)
    ck, out = find_checkpoint(run), tmp_path / "eval"
    first = score(run, out)
    assert "cached" not in first and first["provenance"]["model"]["weights"] == "verified"
    assert score(run, out).get("cached")                                        # the control: reused when verified
    original = ck / "__0_0.distcp"
    size = original.stat().st_size
    r0 = _read()
    assert reusable(checkpoint_identity(ck, run))                               # the load verified it: not read again
    assert _read() - r0 < size / 10
    original.touch()                                                            # control: a file changed since
    r0 = _read()
    assert reusable(checkpoint_identity(ck, run)) and _read() - r0 >= size      # is hashed again
    shutil.copy(original, tmp_path / "kept.distcp")
    shutil.copy(find_checkpoint(other) / "__0_0.distcp", original)             # same shapes, other weights
    with pytest.raises(EvalError) as e: score(run, out)
    assert "\n" not in str(e.value) and f"{original} differs from its sha256 in digests.json" in str(e.value)
    model = checkpoint_identity(ck, run)
    assert model["fingerprint"] == first["provenance"]["model"]["fingerprint"]   # the fingerprint cannot tell
    assert not reusable(model) and "__0_0.distcp differs" in model["unidentified"]
    shutil.copy(tmp_path / "kept.distcp", original)                             # the right weights back
    back = score(run, out)
    assert back.get("cached") and back["loglikelihoods"] == first["loglikelihoods"]
