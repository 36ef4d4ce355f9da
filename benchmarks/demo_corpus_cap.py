"""The demo's corpus stage made cold at the default cap (3 MB of text a source) and at the short demo test's
(`mtnlg demo --max-bytes 500000`), one after the other in one run: seconds, documents, tokens and what curation removed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/demo_corpus_cap.py [CAP ...] [--json NAME]

Other caps can be given (e.g. `500000 400000 --json demo_corpus_cap_400k.json`: the test's old cap and its
new one).

The fetched files (`<cache>/sources/raw`, left by an earlier demo) are copied into a fresh cache folder for each, so
nothing is downloaded and each corpus is curated, decontaminated against tests/data/eval and tokenized from scratch.
Writes benchmarks/demo_corpus_cap.json.
"""
import argparse, json, os, shutil, tempfile, time
from pathlib import Path
from mtnlg.config import cache_root
from mtnlg.corpus import prepare_demo_corpus

ROOT = Path(__file__).resolve().parents[1]
CAPS = (3_000_000, 500_000)        # the default, the test's
KEPT = ("docs_in", "exact_dups", "fuzzy_dups", "scored", "low_quality", "docs_out", "tokens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caps", nargs="*", type=int, default=list(CAPS),
                    help="bytes of text a source, each in turn")
    ap.add_argument("--json", default="demo_corpus_cap.json", help="the file written under benchmarks/")
    args = ap.parse_args()
    rows = []
    for cap in args.caps:
        with tempfile.TemporaryDirectory() as tmp:      # each its own cache: the eval n-grams made in both
            shutil.copytree(cache_root() / "sources" / "raw", Path(tmp) / "sources" / "raw")
            load, t0 = os.getloadavg()[0], time.time()
            spec = prepare_demo_corpus(tmp, ROOT / "tests" / "data" / "eval", max_bytes=cap, log=None)
            seconds = time.time() - t0
            sources = json.loads((spec.parent / "report.json").read_text())["sources"]
            rows.append({"max_bytes": cap, "seconds": round(seconds, 1), "load_before": round(load, 1),
                         "load_after": round(os.getloadavg()[0], 1),
                         "sources": {n: {k: q[k] for k in KEPT} for n, q in sources.items()}})
            print(json.dumps(rows[-1]), flush=True)
    (ROOT / "benchmarks" / args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
