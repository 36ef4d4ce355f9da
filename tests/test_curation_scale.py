"""Curation stages at corpus scale: a bucket task's memory under many copies of one page, open files under many tasks."""
import json, os, subprocess, sys, time, tracemalloc
from pathlib import Path
import numpy as np
import pytest

from mtnlg.data import Source
from mtnlg.curation import CurationRun, prepare_run, run_local
from mtnlg.dedup import DedupBuckets, DedupCluster, dedup_decisions

from conftest import ROOT


def _pages(data, n: int, size: int = 1500) -> list[str]:
    "`n` distinct pages of real text: consecutive `size`-character cuts of the Gutenberg books."
    out = []
    for book in sorted((data / "corpus/gutenberg").glob("*.txt")):
        text = book.read_text(encoding="latin-1")        # some of the books are Latin-1
        out += [text[i:i + size] for i in range(3000, len(text) - size, size)]
    assert len(out) >= n
    return out[:n]


def _near(text: str) -> str:
    "A near-duplicate: one word in 150 changed (estimated Jaccard ~0.9 with word 5-gram shingles)."
    words = text.split()
    words[::150] = ["X"] * len(words[::150])
    return " ".join(words)


def _bucket_task(run, collapse: bool, world_size: int = 1) -> dict:
    "What task 0 of stage 2 held (its peak traced by tracemalloc): with `world_size` tasks, the units 0, n, 2n, ..."
    step = DedupBuckets(run, collapse=collapse)
    tracemalloc.start()
    try: list(step.run(rank=0, world_size=world_size))
    finally: tracemalloc.stop()
    return step.held


def test_copies_of_one_page_verified_once(tmp_path, fixture_data):
    "10k copies of a page + 300 distinct pages: the bucket task loads no copy's MinHash row; without the collapse it does."
    copies, distinct = 10_000, _pages(fixture_data, 300)
    page = (fixture_data / "corpus/wikitext2/test.txt").read_text()[1000:1400]   # the page copied 10k times
    variants = [page, page.upper(), "  " + page.replace(" ", "\n ")]   # equal after normalization: exact copies
    files = [[page] + distinct[:150],
             [variants[i % 3] for i in range(copies)] + distinct[150:] + [_near(page), _near(distinct[0])]]
    (tmp_path / "in").mkdir()
    for f, docs in enumerate(files):
        (tmp_path / "in" / f"{f}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    expected = {(1 << 32) | j: 1 for j in range(copies)} | {(1 << 32) | (copies + 150): 2, (1 << 32) | (copies + 151): 2}
    run = prepare_run(CurationRun([Source("web", str(tmp_path / "in"))], str(tmp_path / "run"), tasks=1))
    run_local(run, workers=1, log=None, stop_after="1_read")
    nb, _ = run.lsh_bands()
    # positive control first (stage 3 then reads the measured task's marks): the old way, every copy verified, on
    # the task's first unit only (band 0: one LSH band is enough to show it, and 9 would take 9 times as long)
    t0 = time.time()
    old = _bucket_task(run, collapse=False, world_size=nb + 1)
    t1 = time.time()
    held = _bucket_task(run, collapse=True)                 # the whole task: the 9 LSH bands and the exact band
    t2 = time.time()
    print(f"\ncollapse: {held} ({t2 - t1:.1f}s)\nevery copy, band 0: {old} ({t1 - t0:.1f}s)")
    list(DedupCluster(run).run(rank=0, world_size=1))
    assert dedup_decisions(run.out) == expected                     # all copies but the first: exact; the two near ones
    assert len(np.load(tmp_path / "run/work/pairs/00000.npy")) == 2
    docs = sum(len(f) for f in files)
    # what the task held: every row of every band read once (one unit a time), the copies collapsed in each LSH band
    assert held["rows_total"] == docs * (nb + 1) and held["rows_max"] == old["rows_max"] == docs
    assert held["collapsed"] == nb * copies
    # MinHash rows loaded: bounded by the distinct documents' groups (the page and its near copy), not the copies
    assert held["minhash_max"] <= 3 and held["minhash_rows"] <= nb * 4
    assert old["minhash_max"] > copies and old["minhash_rows"] > copies
    # peak traced memory: the unit's table (32 B a row) and its sort, the marks (one per copy, 4 int64) and their
    # sort, a MinHash row (1 KB) per distinct document, 1 MB of slack; no term of 1 KB per copy
    bound = 160 * held["rows_max"] + 160 * held["marks"] + 1024 * len(distinct) + 2**20
    assert held["peak_traced"] < bound < old["peak_traced"], (held["peak_traced"], bound, old["peak_traced"])


def _variant(text: str, k: int) -> str:
    "Near-duplicate `k` of `text`: its word k replaced (each variant differs from the others)."
    words = text.split()
    words[k] = "X"
    return " ".join(words)


def _fds_corpus(root, data, books: int = 120, speeches: int = 10) -> list[Source]:
    "Two sources of one-document files: book pages (exact and near copies of one page among them) and speeches."
    pages = _pages(data, books, size=700)
    for i in range(10, 20): pages[i] = pages[0].upper()                  # exact copies, each in its own task
    long = _pages(data, 1, size=6000)[0]                                  # near copies of a long page (one word
    for i in range(20, 50): pages[i] = _variant(long, i)                  # changed each): most share every bucket
    speech = [p.read_text()[:900] for p in sorted((data / "corpus/us_speeches/inaugural").glob("*.txt"))[:speeches]]
    for name, docs in (("books", pages), ("speeches", speech)):
        (root / name).mkdir(parents=True)
        for i, t in enumerate(docs): (root / name / f"{i:04d}.jsonl").write_text(json.dumps({"text": t}) + "\n")
    return [Source("books", str(root / "books")), Source("speeches", str(root / "speeches"))]


# Many tasks under a low open-files limit: more tasks (each stage-1 shard 2 signature files) than the limit allows
# open at once, each of the 130 documents in a task of its own; the ratio of 400 tasks under 256 (2/5 of each).
TASKS, LIMIT = 160, 102


def _child(out, mode: str, limit: int = LIMIT):
    "Run tests/curation_fds_worker.py under an open-files limit of `limit`."
    return subprocess.run([sys.executable, str(ROOT / "tests/curation_fds_worker.py"), str(out), mode, str(limit)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _run_many(tmp_path, data, mode: str):
    "The corpus with tasks=2 (no limit) and `TASKS` tasks in a child under `LIMIT` open files: (sources, the run)."
    srcs = _fds_corpus(tmp_path / "in", data)
    run_local(prepare_run(CurationRun(srcs, str(tmp_path / "t2"), tasks=2)), workers=1, log=None)
    many = prepare_run(CurationRun(srcs, str(tmp_path / "many"), tasks=TASKS))
    t0 = time.time()
    r = _child(many.out, mode)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\ntasks={TASKS} ({mode}) under {LIMIT} open files: {res} ({time.time() - t0:.1f}s)")
    assert max(res["open_files_max"].values()) <= 64          # a constant: one part, one band table... at a time
    for s in srcs:
        for f in (f"curated/{s.name}.jsonl", f"indexed/{s.name}.bin", f"indexed/{s.name}.idx"):
            assert (tmp_path / "many" / f).read_bytes() == (tmp_path / "t2" / f).read_bytes(), f
    return srcs, many


def test_many_tasks_under_fewer_open_files(tmp_path, fixture_data):
    "160 tasks under `ulimit -n 102`: the same output as tasks=2; opening every part of a source, as the old merge did, fails."
    assert TASKS > LIMIT > 64 and TASKS > 130           # more shards than open files; each document its own task
    # datatrove's LocalPipelineExecutor with one worker: every stage's tasks one after another
    srcs, many = _run_many(tmp_path, fixture_data, "executor")
    # a bucket task maps at most 16 shards' signatures (2 files each): a bucket of the near copies spans more shards
    buckets = [json.loads(f.read_text())["held"] for f in (tmp_path / "many/stats/buckets").glob("*.json")]
    assert max(h["minhash_max"] for h in buckets) > 16 and 16 < max(h["open_files_max"] for h in buckets) <= 48
    rep = json.loads((tmp_path / "many/report.json").read_text())["sources"]
    assert (rep["books"]["exact_dups"], rep["books"]["fuzzy_dups"], rep["books"]["docs_out"]) == (10, 29, 81)
    assert len(list((tmp_path / "many/work/parts/books").glob("*.idx"))) == 81        # 81 parts: 81 tasks kept some
    # positive control: the old merge's way (a source's parts all open: .bin and .idx maps and the jsonl) fails
    r = _child(many.out, "old_merge")
    assert r.returncode != 0 and "Too many open files" in r.stdout, r.stdout + r.stderr[-2000:]
