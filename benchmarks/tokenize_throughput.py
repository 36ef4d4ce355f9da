"""Tokens/s of the preprocessing pipeline (jsonl -> megatron-core .bin/.idx, worker processes) vs the bare
GPT-2 tokenizer on the same text, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokenize_throughput.py [--mb 8] [--workers 2] [--corpus DIR]

The text is real: the .txt files of tests/data/corpus (or --corpus, e.g. a full corpus folder), split into ~4 KB documents and repeated
up to --mb megabytes. Prints one JSON line per measurement.
"""
import argparse, json, os, sys, tempfile, time
from pathlib import Path

from mtnlg.tokenizer import get_tokenizer, gpt2_encoding
from mtnlg.indexed import tokenize_to_indexed, indexed_stats


def corpus_texts(root: Path, mb: float, doc_chars: int = 4000):
    "Real documents of about `doc_chars` characters, `mb` megabytes in all."
    files = sorted(p for p in root.rglob("*.txt") if p.name not in ("LICENSE.txt", "SOURCE.txt"))
    base = []
    for p in files:
        t = p.read_text(encoding="utf-8", errors="replace")
        base += [t[i:i + doc_chars] for i in range(0, len(t), doc_chars)]
    out, n = [], 0
    while n < mb * 1e6:
        for t in base:
            out.append(t); n += len(t.encode())
            if n >= mb * 1e6: break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--corpus", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" / "corpus"))
    a = ap.parse_args()
    texts = corpus_texts(Path(a.corpus), a.mb)
    tok = get_tokenizer("gpt2")
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / "bench.jsonl"
        with open(src, "w", encoding="utf-8") as f:
            for t in texts: f.write(json.dumps({"text": t}) + "\n")
        t0 = time.perf_counter(); n_bare = sum(len(tok.tokenize(t)) for t in texts); bare = time.perf_counter() - t0
        enc = gpt2_encoding()
        t0 = time.perf_counter(); n_batch = sum(map(len, enc.encode_ordinary_batch(texts, num_threads=a.workers)))
        batch = time.perf_counter() - t0
        res = {}
        for w in sorted({1, a.workers}):
            r = tokenize_to_indexed(src, Path(td) / f"out{w}", workers=w, log=None)
            assert r["tokens"] == n_bare + len(texts) == indexed_stats(Path(td) / f"out{w}")["tokens"]
            res[w] = r
    rows = [dict(what="bare tokenizer, 1 thread (encode_ordinary per doc)", tokens=n_bare, seconds=round(bare, 3),
                 tokens_per_s=round(n_bare / bare)),
            dict(what=f"bare tiktoken encode_ordinary_batch, {a.workers} threads", tokens=n_batch,
                 seconds=round(batch, 3), tokens_per_s=round(n_batch / batch))]
    rows += [dict(what=f"pipeline jsonl -> .bin/.idx, {w} worker(s)", tokens=r["tokens"], seconds=r["seconds"],
                  tokens_per_s=r["tokens_per_s"]) for w, r in res.items()]
    print(json.dumps(dict(documents=len(texts), megabytes=a.mb, cpus=os.cpu_count())))
    for r in rows: print(json.dumps(r))


if __name__ == "__main__":
    sys.exit(main())
