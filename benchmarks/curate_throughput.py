"""MB/s per CPU of the curation: the datatrove stages (`mtnlg.curation`, 1 and 2 local workers) against today's
one-process `mtnlg.data.curate` (+ `tokenize_to_indexed`) on the same input, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/curate_throughput.py [--mb 6] [--tasks 4] [--data DIR]

The input is real text: ~4 KB documents of DIR/corpus (Gutenberg books and Wikipedia as two sharded sources, Stack
Exchange posts as a quality-filtered web source), decontaminated against DIR/eval; DIR is --data, else
$MTNLG_BENCH_DATA, else the committed fixtures tests/data (about 3 MB of text: pass the full folder for --mb 6).
Each configuration runs in a fresh process; it reports wall seconds, CPU seconds of the process and its workers,
peak resident memory of the largest process, and (stages) the CPU seconds each step spent on its own work.
Prints one JSON line per measurement; the outputs of all configurations are checked equal (same token ids).
"""
import argparse, html, json, os, pickle, re, resource, subprocess, sys, tempfile, time
from pathlib import Path
from mtnlg import indexed as IX
from mtnlg import tokenizer as TK

DATA = Path(os.environ.get("MTNLG_BENCH_DATA") or Path(__file__).resolve().parents[1] / "tests" / "data")


def corpus(root: Path, out: Path, mb: float, doc_chars: int = 4000):
    "Write the benchmark sources under `out`; [(name, path, quality_filter)] and the classifier's texts."
    from mtnlg.data import html_to_text
    def docs(files):
        for p in files:
            t = p.read_text(encoding="utf-8", errors="replace")
            yield from (t[i:i + doc_chars] for i in range(0, len(t), doc_chars))
    budget = {"books": 0.6, "wiki": 0.25, "web": 0.15}
    books = docs(sorted((root / "gutenberg").glob("*-*.txt")))
    wiki = docs(sorted((root / "wikitext2").glob("*.txt")))
    web = (html_to_text(html.unescape(b)) for s in ("beer", "coffee")
           for b in re.findall(r'Body="([^"]*)"', (root / f"stackexchange/{s}/Posts.xml").read_text()))
    srcs = []
    for name, it, shards in (("books", books, 4), ("wiki", wiki, 2), ("web", web, 1)):
        (out / name).mkdir(parents=True, exist_ok=True)
        fs = [open(out / name / f"{i}.jsonl", "w", encoding="utf-8") for i in range(shards)]
        n = k = 0
        for t in it:
            if not t.strip(): continue
            fs[k % shards].write(json.dumps({"text": t}) + "\n"); n += len(t.encode()); k += 1
            if n >= budget[name] * mb * 1e6: break
        for f in fs: f.close()
        srcs.append((name, str(out / name), name == "web"))
    return srcs


def child(cfg: dict) -> dict:
    "Run one configuration in this process; its measurements."
    import mtnlg.data as D
    srcs = [D.Source(n, p, quality_filter=q) for n, p, q in cfg["sources"]]
    qc = pickle.loads(Path(cfg["qc"]).read_bytes())
    out = Path(cfg["out"])
    t0, c0 = time.perf_counter(), os.times()
    res = {"what": cfg["what"]}
    if cfg["kind"] == "single":
        D.curate(srcs, out / "curated", eval_dir=cfg["eval"], quality=qc, cache_dir=cfg["cache"], log=None)
        c1 = os.times(); res["curate_cpu_s"] = round(sum(c1[:4]) - sum(c0[:4]), 2)
        TK.get_tokenizer("gpt2"); import megatron.core.datasets.indexed_dataset   # imports: counted in cpu_s only
        c2 = os.times()
        for s in srcs:
            IX.tokenize_to_indexed(out / "curated" / f"{s.name}.jsonl", out / "indexed" / s.name, workers=1, log=None)
        res["tokenize_cpu_s"] = round(sum(os.times()[:4]) - sum(c2[:4]), 2)
        res["work_cpu_s"] = round(res["curate_cpu_s"] + res["tokenize_cpu_s"], 2)
    else:
        from loguru import logger
        logger.remove()
        from mtnlg.curation import CurationRun, curate_run, load_stats
        run = CurationRun(srcs, str(out), tasks=cfg["tasks"], eval_dir=cfg["eval"], cache_dir=cfg["cache"])
        curate_run(run, qc, workers=cfg["workers"], log=None)
        res["steps_cpu_s"] = {k: round(v["cpu_s"], 3) for k, v in load_stats(out).items()}
        res["work_cpu_s"] = round(sum(res["steps_cpu_s"].values()), 2)
    c1 = os.times()
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    res["cpu_s"] = round(sum(c1[:4]) - sum(c0[:4]), 2)
    res["peak_rss_mb_self"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    res["peak_rss_mb_worker"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=6.0)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--data", default=str(DATA), help="a folder holding corpus/ and eval/ (default: tests/data)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child)))); return
    import mtnlg.decontam as DC
    from mtnlg.corpus import planted_corpus
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        srcs = corpus(Path(a.data) / "corpus", td / "in", a.mb)
        mb = sum(f.stat().st_size for _, p, _ in srcs for f in Path(p).glob("*.jsonl")) / 1e6
        _, qc, _ = planted_corpus(td / "planted", Path(a.data))                  # the tests' classifier
        (td / "qc.pkl").write_bytes(pickle.dumps(qc))
        DC.eval_ngrams(Path(a.data) / "eval", cache_dir=td / "cache")           # built once, cached for all
        base = dict(sources=srcs, qc=str(td / "qc.pkl"), eval=str(Path(a.data) / "eval"), cache=str(td / "cache"))
        cfgs = [dict(base, kind="single", what="today: curate + tokenize_to_indexed, one process", out=str(td / "single"))]
        cfgs += [dict(base, kind="stages", what=f"datatrove stages, {a.tasks} tasks, {w} worker(s)", tasks=a.tasks,
                      workers=w, out=str(td / f"stages{w}")) for w in (1, 2)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        rows = []
        for c in cfgs:
            p = subprocess.run([sys.executable, __file__, "--child", json.dumps(c)], capture_output=True, text=True, env=env)
            if p.returncode: sys.exit(p.stderr[-3000:])
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["MB_in"] = round(mb, 2)
            r["MB_per_s_per_cpu"] = round(mb / r["cpu_s"], 3)
            r["MB_per_s_wall"] = round(mb / r["wall_s"], 3)
            r["work_MB_per_s_per_cpu"] = round(mb / r["work_cpu_s"], 3)     # the rules' own CPU time, no start-up
            if "steps_cpu_s" in r:
                r["steps_MB_per_s_per_cpu"] = {k: round(mb / v, 2) for k, v in r["steps_cpu_s"].items() if v > 0}
            rows.append(r)
        for name, *_ in srcs:      # every configuration wrote the same token ids
            ref = (td / "single/indexed" / f"{name}.bin").read_bytes()
            assert all((td / f"stages{w}/indexed/{name}.bin").read_bytes() == ref for w in (1, 2)), name
    print(json.dumps(dict(megabytes=round(mb, 2), cpus=os.cpu_count(), load=os.getloadavg()[0])))
    for r in rows: print(json.dumps(r))
    one = rows[0]["MB_per_s_per_cpu"]
    print(json.dumps({"ratio_MB_per_s_per_cpu_vs_today": {r["what"]: round(r["MB_per_s_per_cpu"] / one, 2) for r in rows[1:]}}))
    work = rows[0]["work_MB_per_s_per_cpu"]
    print(json.dumps({"ratio_work_MB_per_s_per_cpu_vs_today": {r["what"]: round(r["work_MB_per_s_per_cpu"] / work, 2)
                                                               for r in rows[1:]}}))


if __name__ == "__main__":
    main()
