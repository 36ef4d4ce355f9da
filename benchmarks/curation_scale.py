"""What one bucket task holds under many copies of one page, and a curation of many tasks under a low open-files limit.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/curation_scale.py [--copies 2500 5000 10000 20000] [--tasks 400]

1. For each number of copies: one source of 300 distinct Gutenberg pages (1,500 characters) and the copies of one
   400-character Wikipedia page (tests/data), through stage 1 with one task; then stage 2's task 0 with the exact
   copies collapsed (the whole task: 9 LSH bands and the exact band) and without (the old way, band 0 only),
   each traced by tracemalloc: peak traced bytes, MinHash rows loaded (largest group, total), seconds.
2. The corpus of tests/test_curation_scale.py (110 one-document files, 2 sources) with --tasks tasks under
   `ulimit -n 256` in a child (tests/curation_fds_worker.py): every stage's steps task by task ("inline") and
   datatrove's LocalPipelineExecutor with one worker ("executor"); seconds and open files; then the old merge's way of
   opening a source's parts, under the same limit.
Prints one JSON line per measurement.
"""
import argparse, json, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_curation_scale import _pages, _bucket_task, _fds_corpus, _child      # the tests' corpus and helpers
from mtnlg.data import Source
from mtnlg.curation import CurationRun, prepare_run, run_local

DATA = ROOT / "tests" / "data"


def copies_case(tmp: Path, copies: int) -> dict:
    "Stage 2 of one task on `copies` copies of a page + 300 distinct pages: collapsed, and every copy (band 0)."
    page = (DATA / "corpus/wikitext2/test.txt").read_text()[1000:1400]
    (tmp / "in").mkdir(parents=True)
    (tmp / "in/0.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in [page] + _pages(DATA, 300)))
    (tmp / "in/1.jsonl").write_text((json.dumps({"text": page}) + "\n") * copies)
    run = prepare_run(CurationRun([Source("web", str(tmp / "in"))], str(tmp / "run"), tasks=1))
    run_local(run, workers=1, log=None, stop_after="1_read")
    nb, _ = run.lsh_bands()
    out = {"copies": copies}
    for name, kw in (("every_copy_band0", {"collapse": False, "world_size": nb + 1}), ("collapsed", {"collapse": True})):
        t0 = time.time()
        h = _bucket_task(run, **kw)
        out[name] = {"peak_traced_MB": round(h["peak_traced"] / 2**20, 2), "minhash_max": h["minhash_max"],
                     "minhash_rows": h["minhash_rows"], "rows_max": h["rows_max"], "seconds": round(time.time() - t0, 2)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, nargs="*", default=[2500, 5000, 10000, 20000])
    ap.add_argument("--tasks", type=int, default=400)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for c in a.copies: print(json.dumps(copies_case(Path(d) / f"c{c}", c)), flush=True)
        srcs = _fds_corpus(Path(d) / "fds", DATA)
        for mode in ("inline", "executor"):
            run = prepare_run(CurationRun(srcs, str(Path(d) / f"t{a.tasks}-{mode}"), tasks=a.tasks))
            t0 = time.time()
            r = _child(run.out, mode, 256)
            res = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-500:]}
            print(json.dumps({"tasks": a.tasks, "mode": mode, "limit": 256, "wall_s": round(time.time() - t0, 1)} | res))
        r = _child(run.out, "old_merge", 256)
        print(json.dumps({"tasks": a.tasks, "mode": "old_merge", "limit": 256, "rc": r.returncode}
                         | json.loads(r.stdout.strip().splitlines()[-1])))


if __name__ == "__main__":
    main()
