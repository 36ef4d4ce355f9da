"""A stored score is reused only for weights verified by content: a checkpoint's weight files are hashed against its
`digests.json` before a stored score counts, so another checkpoint's file of the same shapes copied over (which
keeps the fingerprint, made from the digests) is scored again, and its score is never reused for the original."""
import shutil
from conftest import DATA
from mtnlg import eval as ev
from mtnlg.generate import demo_checkpoint
from mtnlg.runs import checkpoint_identity, find_checkpoint, run_tokenizer


def score(run, out) -> dict:
    "The 1-shot PIQA result of `run` (one process, 6 documents), stored in or reused from `out`."
    scorer, ck = ev.load_model_for_eval(run, 8)
    model = checkpoint_identity(ck, run)
    return ev.evaluate(scorer, "piqa", [1], 6, out, DATA / "eval", 1234, tokenizer=run_tokenizer(run), log=None,
                       model=model, keep_loglikelihoods=True)[0]


def test_a_swapped_weight_file_is_scored_again(tmp_path):
    run, other = demo_checkpoint(tmp_path / "run"), demo_checkpoint(tmp_path / "other", seed=1)
    ck, out = find_checkpoint(run), tmp_path / "eval"
    first = score(run, out)
    assert "cached" not in first and first["provenance"]["model"]["weights"] == "verified"
    assert score(run, out).get("cached")                                        # the control: reused when verified
    original = ck / "__0_0.distcp"
    shutil.copy(original, tmp_path / "kept.distcp")
    shutil.copy(find_checkpoint(other) / "__0_0.distcp", original)             # same shapes, other weights
    swapped = score(run, out)
    assert "cached" not in swapped and swapped["loglikelihoods"] != first["loglikelihoods"]
    assert swapped["provenance"]["model"]["weights"] == "__0_0.distcp differs from digests.json"
    assert swapped["provenance"]["model"]["fingerprint"] == first["provenance"]["model"]["fingerprint"]
    shutil.copy(tmp_path / "kept.distcp", original)                             # the right weights back
    back = score(run, out)
    assert "cached" not in back and back["loglikelihoods"] == first["loglikelihoods"]   # not the swapped run's
    assert score(run, out).get("cached")
