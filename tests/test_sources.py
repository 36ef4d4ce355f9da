"Reading sources: WARC (charsets, Trafilatura), datatrove's HF reader, files split into units by size."
import io, json, random
from pathlib import Path
import numpy as np
import pytest
import mtnlg.config as CF
import mtnlg.data as D

NAV = "<nav><ul>" + "".join(f"<li><a href='/s{i}'>Section {i} menu</a></li>" for i in range(15)) + "</ul></nav>"
FOOT = ("<footer><p>Copyright 2024 Example Media Group. All rights reserved.</p><p>Privacy policy | Terms of use"
        " | Cookie settings | Contact us</p></footer>")
ASIDE = "<aside><h3>Trending now</h3><ul><li><a href='/t1'>Subscribe to our newsletter</a></li></ul></aside>"
ARTICLES = {   # name: (paragraphs of main text, charset the body is encoded in)
    "cp1252": (["Le café de la place était plein à craquer ce matin-là, et les habitués parlaient de l'été "
                "qui n'en finissait pas. « Quelle chaleur ! » disait la patronne en essuyant le comptoir.",
                "Un client naïf commanda une crème brûlée pour 4 € ; on lui répondit poliment que ce n'était "
                "pas l'heure, et il se contenta d'un croissant tiède et d'un verre d'eau fraîche."], "cp1252"),
    "utf8": (["Die Straßenbahn nach Zürich fährt um acht Uhr, und die Fahrgäste drängen sich schon früh am "
              "Bahnsteig. Über Nacht hat es geschneit, und die Gehwege sind glatt wie Glas.",
              "Ein älterer Herr erzählt von den Wintern seiner Jugend, als die Seen monatelang zugefroren "
              "waren und die Kinder mit Schlittschuhen bis zum nächsten Dorf fuhren — 東京 war weit weg."], "utf-8"),
    "meta": (["A Coruña recibe cada año a miles de peregrinos que llegan a pie desde Santiago, cansados pero "
              "felices. El señor Núñez regenta una pensión junto al puerto desde hace treinta años.",
              "Por las noches, los huéspedes cenan pulpo á feira en la terraza y comentan la jornada; nadie "
              "se queja del camino, aunque a todos les duelen los pies después de tantas etapas."], "latin-1"),
}


def _page(paras, head="", boiler=True):
    body = "".join(f"<p>{p}</p>" for p in paras)
    return (f"<html><head>{head}<title>Page</title><script>var tracker = 1;</script></head><body>"
            + (NAV if boiler else "") + f"<article><h1>Story</h1>{body}</article>"
            + (ASIDE + FOOT if boiler else "") + "</body></html>")


def write_warc(path, pages):
    "A gzipped WARC of (url, content type, body bytes) HTTP responses, written with warcio."
    from warcio.warcwriter import WARCWriter
    from warcio.statusandheaders import StatusAndHeaders
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        for url, ctype, body in pages:
            hd = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=hd))
    return path


def crawl_pages():
    "The test crawl: a charset in the HTTP header (cp1252), UTF-8, a charset only in <meta>, a boilerplate-only page."
    (c, _), (u, _), (m, _) = ARTICLES["cp1252"], ARTICLES["utf8"], ARTICLES["meta"]
    return [("https://a.example/cafe", "text/html; charset=windows-1252", _page(c).encode("cp1252")),
            ("https://b.example/tram", "text/html; charset=UTF-8", _page(u).encode("utf-8")),
            ("https://c.example/pension", "text/html",        # no charset in the header: <meta> says it
             _page(m, head='<meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">').encode("latin-1")),
            ("https://d.example/logo.png", "image/png", b"\x89PNG\r\n"),
            ("https://e.example/menu", "text/html; charset=utf-8",
             f"<html><body>{NAV}{FOOT}</body></html>".encode())]


def test_decode_page_charset_order():
    "BOM, then the HTTP header, then <meta>, then UTF-8, then detection; ISO-8859-1 read as windows-1252."
    body = "prix : 4 € — « déjà vu »".encode("cp1252")
    assert D.decode_page(body, "text/html; charset=ISO-8859-1") == ("prix : 4 € — « déjà vu »", "cp1252")
    meta = b'<meta charset="windows-1252">' + body
    assert D.decode_page(meta, "text/html")[1] == "windows-1252"
    assert D.decode_page(meta, "text/html; charset=koi8-r")[1] == "koi8-r"      # the header wins over <meta>
    assert D.decode_page(b"\xef\xbb\xbf" + "é".encode(), "text/html; charset=cp1252") == ("é", "utf-8-sig")
    assert D.decode_page("ok é".encode(), "text/html; charset=nonsense-42")[1] == "utf-8"   # unknown label passed over
    text, cs = D.decode_page(("Ceci est une phrase française assez longue pour être détectée, "
                              "avec des accents élevés à côté. " * 4).encode("cp1252"), "text/html")
    assert "française" in text and "élevés" in text                     # detected (chardet)
    assert D.decode_page(random.Random(0).randbytes(3000), "text/html")[0] is None


def test_warc_charsets_and_boilerplate(tmp_path):
    p = write_warc(tmp_path / "crawl.warc.gz", crawl_pages())
    sk = D.Skips()
    docs = list(D.read_documents(D.Source("cc", str(p)), on_error="error", skips=sk))   # no error: all decode
    assert [d["id"] for d in docs] == [f"{p}[{i}]" for i in (0, 1, 2)]
    for d, name in zip(docs, ("cp1252", "utf8", "meta")):
        flat = " ".join(d["text"].split())
        for para in ARTICLES[name][0]: assert para in flat, (name, flat)         # accents intact, every word
        for junk in ("Section 3 menu", "Copyright", "Privacy policy", "Subscribe", "Trending", "tracker"):
            assert junk not in flat, (name, junk)
        assert "\ufffd" not in flat and "Ã" not in flat                      # no mojibake
    assert dict(sk) == {} and sk.dropped == {"no_main_text": 1}                # the menu-only page: left out


def test_warc_undecodable_page_per_on_error(tmp_path):
    good = crawl_pages()[1]
    p = write_warc(tmp_path / "bad.warc.gz", [good, ("https://x.example/", "text/html", random.Random(0).randbytes(3000)),
                                              good])
    with pytest.raises(CF.DataError, match=r"bad.warc.gz\[1\]: no charset decodes the page .*on_error='skip'"):
        list(D.read_documents(D.Source("cc", str(p))))
    sk = D.Skips()
    assert len(list(D.read_documents(D.Source("cc", str(p)), on_error="skip", skips=sk))) == 2
    assert dict(sk) == {"undecodable": 1} and sk.first["undecodable"] == f"{p}[1]"
    assert len(list(D.read_documents(D.Source("cc", str(p)), on_error="replace"))) == 2   # replaced: no main text


def test_hf_folder_by_datatrove_reader(tmp_path):
    import datasets
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": ["held out"]}),
                               "train": datasets.Dataset.from_dict({"text": ["one", " ", "three"], "n": [1, 2, 3]})})
    dd.save_to_disk(str(tmp_path / "hf"))
    with pytest.raises(CF.DataError, match=r"hf\[1\]: empty document"):
        list(D.read_documents(D.Source("hf", str(tmp_path / "hf"))))
    sk = D.Skips()
    docs = list(D.read_documents(D.Source("hf", str(tmp_path / "hf")), on_error="skip", skips=sk))
    assert [(d["id"].rsplit("/", 1)[-1], d["text"]) for d in docs] == [("hf[0]", "one"), ("hf[2]", "three")]
    assert dict(sk) == {"empty": 1}
    with pytest.raises(CF.DataError, match=r"no column 'body' \(columns: \['text', 'n'\]\)"):
        list(D.read_documents(D.Source("hf", str(tmp_path / "hf"), text_key="body")))


def _all_parts(src, unit_bytes):
    "Documents of `src` (one file) read part by part, and the parts."
    parts = D.file_parts(src.path, unit_bytes, src.split)
    return [(d["id"], d["text"]) for part in parts for d in D.read_documents(src, part=part)], parts


def test_file_parts_read_as_the_whole_file(tmp_path, fixture_data):
    "Parts of a jsonl, a line and a paragraph text file and a parquet file give the whole file's documents and ids."
    text = (fixture_data / "corpus/tinyshakespeare/input.txt").read_text()[:40_000]
    text = text.replace("\n\n", "\n \t\n", 7).replace("\n\n", "\n\n\n\n", 5).replace("\n", "\r\n", 40)  # odd blanks
    (tmp_path / "t.txt").write_text(text)
    lines = [l for l in text.split("\n") if l.strip()]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": l}) + "\n" + ("\n" if i % 9 == 0 else "")
                                              for i, l in enumerate(lines)))
    import pyarrow as pa, pyarrow.parquet as pq
    pq.write_table(pa.table({"text": lines}), tmp_path / "d.parquet", row_group_size=50)
    for src in (D.Source("j", str(tmp_path / "d.jsonl")), D.Source("l", str(tmp_path / "t.txt"), split="line"),
                D.Source("b", str(tmp_path / "t.txt"), split="blank"), D.Source("p", str(tmp_path / "d.parquet"))):
        whole = [(d["id"], d["text"]) for d in D.read_documents(src)]
        got, parts = _all_parts(src, 2000)
        assert len(parts) > 5 and got == whole, src.name
        assert D.file_parts(src.path, 10**9, src.split) == [None]
    assert D.file_parts(str(tmp_path / "t.txt"), 10, "") == [None]                 # one document a file: whole
    gz = tmp_path / "d.jsonl.gz"; gz.write_bytes(__import__("gzip").compress((tmp_path / "d.jsonl").read_bytes()))
    assert D.file_parts(str(gz), 10, "") == [None]                                 # compressed: whole


def test_bad_line_in_a_part_is_named_by_its_file_line(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(300)) + "{broken\n"
                 + json.dumps({"text": "last"}) + "\n")
    parts = D.file_parts(str(p), 1000, "")
    assert len(parts) > 3
    with pytest.raises(CF.DataError, match=r"in.jsonl:301: malformed JSON"):
        list(D.read_documents(D.Source("s", str(p)), part=parts[-1]))


def _docs_corpus(fixture_data, n=60):
    "n documents of real text (Emma, ~700 characters each) with exact and near duplicates spread over the file."
    words = (fixture_data / "corpus/gutenberg/austen-emma.txt").read_text().split()
    docs = [" ".join(words[i * 120:(i + 1) * 120]) for i in range(n)]
    for i in range(9, n, 13): docs[i] = docs[i - 7].replace(" the ", " THE ", 1) + " fin"   # near duplicates
    for i in range(5, n, 11): docs[i] = docs[i - 4]                                   # exact duplicates
    return docs


def _read_counts(out, tasks):
    "Documents each read task read (from its stats file)."
    return [sum(c.get("docs_out", 0) for c in json.loads((out / f"stats/read/{t:05d}.json").read_text())["sources"].values())
            for t in range(tasks)]


def test_one_file_source_split_into_units(tmp_path, fixture_data):
    "A one-file source at tasks=3: split into units, every read task holds its share; output as from one unit."
    from mtnlg.curation import CurationRun, curate_run
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    src = tmp_path / "web.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs_corpus(fixture_data)))
    size, res = src.stat().st_size, {}
    for name, unit in (("split", size // 7), ("whole", 10**12)):
        run = CurationRun([D.Source("web", str(src))], str(tmp_path / name), tasks=3, unit_bytes=unit)
        rep = curate_run(run, workers=2, log=None)
        units = json.loads((run.path / "units.json").read_text())
        ds = IndexedDataset(str(run.path / "indexed/web"))
        res[name] = dict(units=len(units), counts=_read_counts(run.path, 3), rep=rep["sources"]["web"],
                         text=(run.path / "curated/web.jsonl").read_bytes(),
                         ids=[np.asarray(ds[i]).tolist() for i in range(len(ds))])
    s, w = res["split"], res["whole"]
    assert s["units"] >= 7 and w["units"] == 1
    assert sum(s["counts"]) == sum(w["counts"]) == 60
    assert max(s["counts"]) <= 60 * 0.5 and min(s["counts"]) > 0              # each task: its share
    assert sorted(w["counts"]) == [0, 0, 60]                                    # control: one unit, one task
    assert s["text"] == w["text"] and s["ids"] == w["ids"] and len(s["ids"]) == w["rep"]["docs_out"]
    assert w["rep"]["exact_dups"] == 5 and w["rep"]["fuzzy_dups"] == 4         # duplicates across units found
    assert {k: v for k, v in s["rep"].items() if k not in ("path", "prefix")} == \
        {k: v for k, v in w["rep"].items() if k not in ("path", "prefix")}


def test_warc_through_curate_run(tmp_path):
    "A WARC source through the stages: main text curated (accents intact), boilerplate and the menu page counted."
    from mtnlg.curation import CurationRun, curate_run, load_stats
    p = write_warc(tmp_path / "crawl.warc.gz", crawl_pages())
    run = CurationRun([D.Source("cc", str(p))], str(tmp_path / "run"), tasks=2, min_chars=100, min_words=10)
    rep = curate_run(run, workers=2, log=None)
    out = [json.loads(l) for l in (run.path / "curated/cc.jsonl").read_text().splitlines()]
    assert rep["sources"]["cc"]["docs_out"] == 3 and rep["sources"]["cc"]["skipped_bad_input"] == 0
    flat = " ".join(" ".join(o["text"].split()) for o in out)
    for name in ARTICLES:
        for para in ARTICLES[name][0]: assert para in flat
    assert "Copyright" not in flat and "Section 3 menu" not in flat
    assert load_stats(run.path)["read"]["sources"]["cc"]["no_main_text"] == 1


# The demo's sources (mtnlg.corpus): the standard library's, a pinned PyPI file, a user's folder (`--sources DIR`).

def test_demo_stdlib_sources_built_in_process(tmp_path):
    "stdlib and pytopics from this Python's own files: capped, named by the Python version, fetched once."
    import sys
    from mtnlg.corpus import fetch_demo_sources
    logs = []
    srcs = fetch_demo_sources(tmp_path, max_docs=30, max_bytes=10**8, names=["stdlib", "pytopics"], log=logs.append)
    py = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    assert [s.name for s in srcs] == ["stdlib", "pytopics"] and all(py in s.path for s in srcs)
    docs = {s.name: [json.loads(l)["text"] for l in open(s.path)] for s in srcs}
    assert [len(d) for d in docs.values()] == [30, 30] and min(len(t) for d in docs.values() for t in d) >= 200
    assert any(t.startswith('The "assert" statement') for t in docs["pytopics"])       # the documentation's topics
    assert any("def " in t for t in docs["stdlib"]) and len(logs) == 2
    mtimes = [Path(s.path).stat().st_mtime_ns for s in srcs]
    assert fetch_demo_sources(tmp_path, max_docs=30, max_bytes=10**8, names=["stdlib", "pytopics"],
                              log=logs.append) == srcs
    assert [Path(s.path).stat().st_mtime_ns for s in srcs] == mtimes and len(logs) == 2     # cached: not rewritten
    other = fetch_demo_sources(tmp_path, max_docs=20, max_bytes=10**8, names=["stdlib"], log=logs.append)
    assert other[0].path != srcs[0].path and len(logs) == 3                 # control: other caps, another file
    with pytest.raises(CF.DataError, match=r"demo source 'nope': known: stdlib, shakespeare"):
        fetch_demo_sources(tmp_path, names=["nope"])


def _tiny_tar(path, files):
    import io, tarfile
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))
    return path


def test_demo_pypi_file_pinned_and_checked(tmp_path):
    "pip downloads the pinned docutils sdist from the index pip is set up for; a file of another SHA-256 is refused."
    import hashlib
    from mtnlg.corpus import PYPI_FILES, _fetch_docutils, pip_fetch, unpack_checked
    d = pip_fetch("docutils", tmp_path / "raw")
    assert (d / ".done").exists() and d.name == PYPI_FILES["docutils"][0].replace("==", "-")
    docs = list(_fetch_docutils(tmp_path / "raw"))
    assert len(docs) > 50 and any("reStructuredText" in t for t in docs)
    arc = _tiny_tar(tmp_path / "t.tar.gz", {"p/docs/a.txt": "kept", "p/setup.py": "left out"})
    ok = unpack_checked(arc, hashlib.sha256(arc.read_bytes()).hexdigest(), tmp_path / "ok", under="p/docs/")
    assert [p.relative_to(ok).as_posix() for p in ok.rglob("*") if p.is_file()] == [".done", "p/docs/a.txt"]
    with pytest.raises(CF.DataError, match=r"t.tar.gz: SHA-256 [0-9a-f]{64}, want 0{64} \(the pinned file\)"):
        unpack_checked(arc, "0" * 64, tmp_path / "bad")                   # control: another file
    assert not (tmp_path / "bad").exists()


def _user_folder(root, fixture_data):
    "A user's folder: a book at the top, two in a subfolder (one deeper), and files that are not text or hidden."
    book = lambda f: (fixture_data / "corpus/gutenberg" / f).read_text()[:60_000]
    for f, text in {"emma.txt": book("austen-emma.txt"), "poems/blake.md": book("blake-poems.txt"),
                    "poems/more/leaves.rst": book("whitman-leaves.txt"), "poems/.draft.txt": "hidden draft",
                    "data.csv": "1,2\n", ".cache/x.txt": "hidden folder"}.items():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(text)
    return root


def test_demo_folder_sources_and_bad_values(tmp_path, fixture_data):
    "A folder's own files and each subfolder's make the sources; a missing folder or one without text: one error."
    from mtnlg.corpus import check_demo_sources, folder_sources
    mine = _user_folder(tmp_path / "my books", fixture_data)
    found = folder_sources(mine)
    assert {n: sorted(p.name for p in f) for n, f in found.items()} == \
        {"my_books": ["emma.txt"], "poems": ["blake.md", "leaves.rst"]}
    assert check_demo_sources("pypi") == "pypi" and check_demo_sources(str(mine)).keys() == found.keys()
    (tmp_path / "no text").mkdir()
    (tmp_path / "no text" / "data.csv").write_text("1,2\n")
    for bad, why in ((tmp_path / "missing", "no such folder"), (mine / "emma.txt", "no such folder"),
                     (tmp_path / "no text", "no text file in it"), ("pypy", "no such folder")):
        with pytest.raises(CF.DataError, match=rf"--sources .*: {why}; pass a folder of text files \(\.txt, "
                                               rf"\.md, \.rst, \.text\), or 'pypi' or 'debian'"):
            check_demo_sources(bad)


def test_demo_bad_sources_refused_before_any_work(tmp_path, capsys):
    "`mtnlg demo` and `mtnlg data demo-corpus` with `--sources MISSING`: exit 2, the error, nothing made."
    import argparse
    from mtnlg import corpus, demo
    args = demo.cli_parser(argparse.ArgumentParser()).parse_args(
        ["--out", str(tmp_path / "demo"), "--sources", str(tmp_path / "missing")])
    assert demo.cli_run(args) == 2 and not (tmp_path / "demo").exists()
    assert f"mtnlg demo: --sources {tmp_path / 'missing'}: no such folder" in capsys.readouterr().err
    args = corpus.cli_parser(argparse.ArgumentParser()).parse_args(
        ["demo-corpus", "--cache-dir", str(tmp_path / "cache"), "--sources", str(tmp_path / "missing")])
    assert corpus.cli_run(args) == 2 and not (tmp_path / "cache").exists()
    assert "mtnlg data demo-corpus: --sources" in capsys.readouterr().err


def test_demo_corpus_of_a_folder_through_the_data_command(tmp_path, fixture_data, capsys):
    "`mtnlg data demo-corpus --sources DIR`: the folder's sources curated, decontaminated, blended equally, cached."
    import argparse
    from mtnlg import corpus
    from mtnlg.indexed import load_blend
    mine = _user_folder(tmp_path / "mine", fixture_data)
    argv = ["demo-corpus", "--cache-dir", str(tmp_path / "cache"), "--eval-dir", str(fixture_data / "eval"),
            "--sources", str(mine), "--max-docs", "8"]
    args = corpus.cli_parser(argparse.ArgumentParser()).parse_args(argv)
    assert corpus.cli_run(args) == 0
    spec = Path(capsys.readouterr().out.strip().splitlines()[-1])
    blend = load_blend(spec)
    assert [(e.name, e.weight) for e in blend] == [("mine", 0.5), ("poems", 0.5)] and all(e.tokens > 0 for e in blend)
    rep = json.loads((spec.parent / "report.json").read_text())["sources"]
    assert rep["mine"]["docs_in"] == 6 and rep["poems"]["docs_in"] == 8           # emma: 60K characters, 6 pieces
    assert rep["mine"]["scored"] == rep["poems"]["scored"] == 0                      # no quality filter
    assert corpus.prepare_demo_corpus(tmp_path / "cache", fixture_data / "eval", str(mine), max_docs=8,
                                      log=None) == spec                                 # cached by what made it
    key = lambda: corpus._corpus_key(corpus.folder_sources(mine), 8, 3_000_000, "gpt2", fixture_data / "eval", None, [])
    assert spec.parent.name == key()
    (mine / "poems" / "new.txt").write_text("a new poem")
    assert spec.parent.name != key()                                      # control: another file, another corpus
