"""Reading costs of issue 30's sources: planning units by size (`file_parts`), and WARC pages through `decode_page` +
datatrove's Trafilatura (in its sandbox process, and in-process for the sandbox's cost).

    OMP_NUM_THREADS=1 python benchmarks/sources_read.py [--mb 200] [--pages 300]
"""
import argparse, html, io, json, os, re, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mtnlg.data import Source, decode_page, file_parts, read_documents   # noqa: E402


def plan_parts(tmp: Path, mb: int, cold: bool = False) -> dict:
    "MB/s of `file_parts` on a jsonl file of `mb` MB; lines counted by 1 and 8 threads, warm (and `cold`: caches dropped)."
    words = (ROOT / "tests/data/corpus/gutenberg/austen-emma.txt").read_text().split()
    lines = [json.dumps({"text": " ".join(words[i:i + 150])}) + "\n" for i in range(0, len(words) - 150, 150)]
    block = "".join(lines).encode()
    p = tmp / "big.jsonl"
    with open(p, "wb") as f:
        for _ in range(mb * 2**20 // len(block) + 1): f.write(block)
    size = p.stat().st_size
    os.system(f"cat {p} > /dev/null")           # warm the page cache: the figure is the scan, not the disk
    t0 = time.perf_counter()
    parts = file_parts(str(p), 16 << 20)
    dt = time.perf_counter() - t0
    out = {"file_MB": round(size / 1e6, 1), "parts": len(parts), "seconds": round(dt, 3),
           "MB_per_s": round(size / 1e6 / dt, 1)}
    for drop in (False, True) if cold else (False,):     # one thread vs 8 (the lines of parts counted side by side)
        for threads in (1, 8):
            if drop: os.system("sync; echo 3 > /proc/sys/vm/drop_caches")    # the disk's reads, not the cache's
            else: os.system(f"cat {p} > /dev/null")
            t0 = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool: assert file_parts(str(p), 16 << 20, pool=pool) == parts
            out[f"{'cold' if drop else 'warm'}_{threads}_threads_s"] = round(time.perf_counter() - t0, 3)
    p.unlink()
    return out


def warc_pages(tmp: Path, n: int) -> tuple[Path, int]:
    "A WARC of `n` pages: real StackExchange posts wrapped in navigation, sidebar and footer."
    from warcio.warcwriter import WARCWriter
    from warcio.statusandheaders import StatusAndHeaders
    posts = ""
    for site in ("beer", "coffee"):
        posts += (ROOT / f"tests/data/corpus/stackexchange/{site}/Posts.xml").read_text()
    bodies = [html.unescape(b) for b in re.findall(r'Body="([^"]*)"', posts) if len(b) > 600][:n]
    nav = "<nav><ul>" + "".join(f"<li><a href='/{i}'>Section {i}</a></li>" for i in range(30)) + "</ul></nav>"
    foot = "<footer>" + "".join(f"<p>Footer link {i} | Privacy | Terms</p>" for i in range(10)) + "</footer>"
    p, total = tmp / "bench.warc.gz", 0
    with open(p, "wb") as f:
        w = WARCWriter(f, gzip=True)
        for i, b in enumerate(bodies):
            page = (f"<html><head><title>Q{i}</title></head><body>{nav}<article>{b}</article>"
                    f"<aside>Hot questions</aside>{foot}</body></html>").encode()
            total += len(page)
            hd = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(f"https://example.org/{i}", "response", payload=io.BytesIO(page),
                                                http_headers=hd))
    return p, total


def read_warc(p: Path, html_bytes: int, repeat: int = 3) -> dict:
    "Pages/s of `read_documents` (sandboxed Trafilatura) and of in-process extraction: medians of `repeat` rounds."
    import statistics
    from warcio.archiveiterator import ArchiveIterator
    from datatrove.pipeline.extractors import Trafilatura
    ex = Trafilatura(favour_precision=True, deduplicate=False)
    with open(p, "rb") as f:
        raws = [(r.content_stream().read(), r.http_headers.get_header("Content-Type"))
                for r in ArchiveIterator(f) if r.rec_type == "response"]
    boxed, direct = [], []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        docs = list(read_documents(Source("cc", str(p)), on_error="skip"))
        boxed.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        texts = [ex.extract(decode_page(raw, ct)[0]) for raw, ct in raws]
        direct.append(time.perf_counter() - t0)
    assert [d["text"] for d in docs] == [t for t in texts if t]
    b, d = statistics.median(boxed[1:]), statistics.median(direct[1:])
    return {"pages": len(raws), "docs": len(docs), "html_MB": round(html_bytes / 1e6, 2),
            "sandboxed_s": round(b, 2), "pages_per_s": round(len(raws) / b, 1),
            "html_MB_per_s": round(html_bytes / 1e6 / b, 2),
            "in_process_s": round(d, 2), "in_process_pages_per_s": round(len(raws) / d, 1)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--cold", action="store_true", help="also time with the page cache dropped before each run "
                    "(root: drops the whole machine's cache)")
    a = ap.parse_args()
    if a.cold and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        sys.exit("sources_read: --cold needs write access to /proc/sys/vm/drop_caches (root); run without it")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        res = {"file_parts": plan_parts(d, a.mb, a.cold)}
        p, nbytes = warc_pages(d, a.pages)
        res["warc"] = read_warc(p, nbytes)
    print(json.dumps(res, indent=1))
