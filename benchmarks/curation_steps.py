"""MB/s per CPU and peak memory of the curation steps, each against datatrove's own step where one exists, one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/curation_steps.py [--data DIR] [--mb 3] [--repeat 3] [--out F]

Input: real text of DIR/corpus (DIR: --data, else the committed fixtures tests/data): ~4 KB documents of the
Gutenberg books, WikiText-2, the speeches and Tiny Shakespeare, up to --mb MB, as one jsonl file; web pages are the
Stack Exchange posts of DIR/corpus/stackexchange, each wrapped in a page with navigation, a script and a footer and
written as HTML responses of a WARC file. Pairs, each the project's step and datatrove's on the same input:

- read: `mtnlg.data.read_documents` vs datatrove `JsonlReader`;
- warc: `read_documents` of the WARC (warcio + the project's extractor) vs datatrove's `Trafilatura` step on the same
  warcio records (datatrove's `WarcReader` needs cchardet and python-magic, not in environments/cpu.txt);
- minhash: the `DedupSignatures` step vs `MinhashDedupSignature` (9 x 13, word 5-grams); minhash_hash: their hash
  functions alone (`FuzzyDeduper.signature` vs `get_shingles` + `get_signature`);
- tokenize: the `TokenizeShards` step vs `MegatronDocumentTokenizer` (the offline GPT-2 tokenizer.json);
  tokenize_ids: the encoders alone (tiktoken `encode_ordinary` vs `tokenizers` `encode_batch`);
- quality: the `QualityFilter` step alone (datatrove has no linear-classifier step).

Each measurement runs in a forked child (imports done before the fork): CPU = user + sys of the child and of the
processes it waited for (datatrove's extractor sandbox), MB = bytes of text into the step, peak memory = the
child's peak resident set during the step (VmHWM after resetting it), and its growth over the resident set at the
start. Medians of --repeat interleaved rounds; ratio = project MB/s per CPU / datatrove's. JSON to --out.
"""
import argparse, html, io, json, os, pickle, re, resource, shutil, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _status(key):
    "A /proc/self/status field in bytes."
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"): return int(line.split()[1]) * 1024
    return 0


def _cpu() -> float:
    "CPU seconds of this process (all its threads, ns clock) and of the children it waited for."
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def measure(fn, mb: float, times: int = 1) -> dict:
    "Run `fn()` `times` times in a forked child: CPU seconds (child + waited-for children), wall, MB/s per CPU, peak RSS."
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            try: Path("/proc/self/clear_refs").write_text("5")     # reset VmHWM to the current RSS
            except OSError: pass
            rss0, t0, c0 = _status("VmRSS"), time.perf_counter(), _cpu()
            for _ in range(times): fn()
            cpu, wall = _cpu() - c0, time.perf_counter() - t0
            peak = _status("VmHWM")
            res = {"cpu_s": cpu, "wall_s": wall, "peak_rss_mb": peak / 2**20, "peak_growth_mb": (peak - rss0) / 2**20}
        except BaseException as e:
            res = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, pickle.dumps(res))
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f: res = pickle.loads(f.read())
    os.waitpid(pid, 0)
    if "error" in res: raise RuntimeError(res["error"])
    res["mb"], res["mb_s_per_cpu"] = mb * times, mb * times / res["cpu_s"] if res["cpu_s"] > 0 else float("nan")
    return res


def build_inputs(data: Path, work: Path, mb: float, doc_chars: int = 4000):
    "docs.jsonl (~`mb` MB of real text), crawl.warc.gz (Stack Exchange pages), texts for the classifier."
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter
    from mtnlg.data import html_to_text
    c = data / "corpus"
    files = (sorted((c / "gutenberg").glob("*-*.txt")) + sorted((c / "wikitext2").glob("*.txt"))
             + sorted((c / "us_speeches").rglob("*.txt")) + sorted((c / "tinyshakespeare").glob("*.txt")))
    texts, n = [], 0
    for p in files:
        t = p.read_text(encoding="utf-8", errors="replace")
        for i in range(0, len(t), doc_chars):
            if len(t[i:i + doc_chars].strip()) < 200: continue
            texts.append(t[i:i + doc_chars]); n += len(texts[-1].encode())
            if n >= mb * 1e6: break
        if n >= mb * 1e6: break
    (work / "jsonl").mkdir(parents=True)
    with open(work / "jsonl/docs.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(texts): f.write(json.dumps({"text": t, "id": str(i)}) + "\n")
    bodies = [html.unescape(b) for s in ("beer", "coffee")
              for b in re.findall(r'Body="([^"]*)"', (c / f"stackexchange/{s}/Posts.xml").read_text())]
    pages = [f"<html><head><title>Post {i}</title><script>var x = {i};</script></head><body><nav><a href='/'>Home</a> | "
             f"<a href='/tags'>Tags</a> | <a href='/users'>Users</a></nav><main><h1>Question {i}</h1>{b}</main>"
             f"<footer>Site design / logo (c) Stack Exchange Inc; user contributions licensed under CC BY-SA</footer>"
             f"</body></html>" for i, b in enumerate(bodies)]
    with open(work / "crawl.warc.gz", "wb") as f:
        w = WARCWriter(f, gzip=True)
        for i, page in enumerate(pages):
            hd = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.0")
            w.write_record(w.create_warc_record(f"https://example.stackexchange.com/q/{i}", "response",
                                                payload=io.BytesIO(page.encode()), http_headers=hd))
    web = [html_to_text(b) for b in bodies]
    return texts, pages, web


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "tests" / "data"), help="folder holding corpus/ (the fixtures)")
    ap.add_argument("--mb", type=float, default=3.0, help="MB of text for the document steps (at most)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "curation_steps.json"))
    a = ap.parse_args()
    # every import before the forks, so that no child pays for one
    import numpy as np
    from loguru import logger
    from warcio.archiveiterator import ArchiveIterator
    from datatrove.data import Document
    from datatrove.pipeline.dedup import MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import MegatronDocumentTokenizer
    from datatrove.utils.word_tokenizers import WordTokenizer
    from tokenizers import Tokenizer
    import megatron.core.datasets.indexed_dataset  # noqa: F401
    import sklearn.linear_model, trafilatura, inscriptis  # noqa: F401
    from mtnlg import data as D
    from mtnlg.curation import CurationRun
    from mtnlg.curation_steps import QualityFilter, TokenizeShards
    from mtnlg.dedup import DedupSignatures
    from mtnlg.tokenizer import get_tokenizer, gpt2_tokenizers_json
    logger.disable("datatrove")

    class Words(WordTokenizer):
        "Words split on whitespace (datatrove's English default wants spacy)."
        def word_tokenize(self, text, language=None): return text.split()
        def sent_tokenize(self, text, language=None): return re.split(r"(?<=[.!?])\s+", text)
        def span_tokenize(self, text, language=None): return [m.span() for m in re.finditer(r"\S+", text)]

    work = Path(tempfile.mkdtemp(prefix="mtnlg-bench-steps-"))
    try:
        texts, pages, web = build_inputs(Path(a.data), work, a.mb)
        mb_text = sum(len(t.encode()) for t in texts) / 1e6
        mb_jsonl = (work / "jsonl/docs.jsonl").stat().st_size / 1e6
        mb_html = sum(len(p.encode()) for p in pages) / 1e6
        tok = get_tokenizer("gpt2")
        tok.tokenize("warm up")
        hf_json = gpt2_tokenizers_json(work / "gpt2.json")
        hf = Tokenizer.from_file(str(hf_json))
        good = [t[:3000] for t in texts[::2]][:400]
        qc = D.QualityClassifier().fit(good, web[:400])
        docs = lambda: (Document(text=t, id=str(i), metadata={"source": "s", "key": i}) for i, t in enumerate(texts))
        cfg = MinhashConfig(n_grams=5, num_buckets=9, hashes_per_bucket=13)
        fz = D.FuzzyDeduper(0.8, 128, 5, 1)
        dt_sig = MinhashDedupSignature(str(work / "unused"), config=cfg, language=Words())
        dt_tok = MegatronDocumentTokenizer(str(work / "dt_tokens"), tokenizer_name_or_path=str(hf_json))
        dt_tok.tokenizer                    # loaded before the forks, as the project's (cached) tokenizer is

        def fresh_run(q=False):
            "A prepared run folder for the project's steps (they read and write under it)."
            r = CurationRun([D.Source("s", str(work / "jsonl/docs.jsonl"), quality_filter=q)],
                            str(work / f"run{time.time_ns()}"))
            (r.path / "work").mkdir(parents=True)
            if q: (r.path / "quality.pkl").write_bytes(pickle.dumps(qc))
            return r

        def warc_records():
            with open(work / "crawl.warc.gz", "rb") as f:
                for i, rec in enumerate(ArchiveIterator(f)):
                    if rec.rec_type == "response":
                        yield Document(text=rec.content_stream().read().decode("utf-8"), id=str(i))

        def drain(it):
            for _ in it or (): pass

        pairs = {
            "read": (mb_jsonl,
                     lambda: drain(D.read_documents(D.Source("s", str(work / "jsonl/docs.jsonl")))),
                     lambda: drain(JsonlReader(str(work / "jsonl")).run())),
            "warc": (mb_html,
                     lambda: drain(D.read_documents(D.Source("w", str(work / "crawl.warc.gz")))),
                     lambda: drain(Trafilatura(timeout=5).run(warc_records()))),
            "minhash": (mb_text,
                        lambda: drain(DedupSignatures(fresh_run()).run(docs())),
                        lambda: drain(MinhashDedupSignature(str(work / f"mh{time.time_ns()}"), config=cfg,
                                                            language=Words()).run(docs()))),
            "minhash_hash": (mb_text,
                             lambda: [fz.signature(t).hashvalues for t in texts],
                             lambda: [dt_sig.get_signature(dt_sig.get_shingles(t)) for t in texts]),
            "tokenize": (mb_text,
                         lambda: drain(TokenizeShards(fresh_run()).run(docs())),
                         lambda: drain(dt_tok.run(docs()))),
            "tokenize_ids": (mb_text,
                             lambda: [tok.tokenize(t) for t in texts],
                             lambda: [e.ids for e in hf.encode_batch(texts)]),
            "quality": (mb_text, lambda: drain(QualityFilter(fresh_run(q=True)).run(docs())), None),
        }
        rounds = {k: {"project": [], "datatrove": []} for k in pairs}
        missing = {}                # datatrove steps that could not run here, and why
        t_start = time.time()
        for rep in range(a.repeat):
            for name, (mb, ours, theirs) in pairs.items():
                times = 10 if name == "read" else 1         # reading is fast: ten passes, for the clock
                rounds[name]["project"].append(measure(ours, mb, times))
                if not theirs or name in missing: continue
                try: rounds[name]["datatrove"].append(measure(theirs, mb, times))
                except RuntimeError as e: missing[name] = str(e)      # e.g. JsonlReader without orjson
        rows = []
        for name, r in rounds.items():
            row = {"step": name, "mb": round(pairs[name][0], 3), "passes": 10 if name == "read" else 1}
            if name in missing: row["datatrove_not_measured"] = missing[name]
            for who, ms in r.items():
                if not ms: continue
                med = lambda k: statistics.median(m[k] for m in ms)
                row[who] = {"mb_s_per_cpu": round(med("mb_s_per_cpu"), 2), "cpu_s": round(med("cpu_s"), 3),
                            "peak_rss_mb": round(med("peak_rss_mb"), 1), "peak_growth_mb": round(med("peak_growth_mb"), 1),
                            "per_round_mb_s_per_cpu": [round(m["mb_s_per_cpu"], 2) for m in ms]}
            if r["datatrove"]:
                row["ratio"] = round(row["project"]["mb_s_per_cpu"] / row["datatrove"]["mb_s_per_cpu"], 3)
                row["ratio_per_round"] = [round(p["mb_s_per_cpu"] / d["mb_s_per_cpu"], 3)
                                          for p, d in zip(r["project"], r["datatrove"])]
            rows.append(row)
            print(json.dumps(row))
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)), "data": a.data,
                "documents": len(texts), "mb_text": round(mb_text, 3), "web_pages": len(pages),
                "mb_html": round(mb_html, 3), "repeat": a.repeat, "seconds": round(time.time() - t_start, 1),
                "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}
        Path(a.out).write_text(json.dumps({"meta": meta, "steps": rows}, indent=1) + "\n")
        print(json.dumps(meta))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
