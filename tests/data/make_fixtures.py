"""Regenerate the committed test fixtures `tests/data/eval` and `tests/data/corpus` from a full data folder.

A maintainer tool, run by hand; tests never import it. Usage (from the repository root):

    python tests/data/make_fixtures.py PATH/TO/data            # writes tests/data/eval and tests/data/corpus
    python tests/data/make_fixtures.py PATH/TO/data --out DIR  # somewhere else

PATH/TO/data holds `eval/` and `corpus/` in the layout tests/data/README.md describes (each task's official
layout; the corpus folders as distributed). Every fixture is a prefix of its source, cut by a fixed rule (the
tables below), so a test that reads the first N documents or characters sees what it sees on the full data.
Bytes are copied as they are: no re-encoding, no newline translation (some corpus files hold Latin-1 bytes or
CRLF, and tests rely on it). The hand-written HANS and RACE samples (tests/data/hans, tests/data/race) are copied
to eval/hans and eval/race: RACE's terms do not clearly allow redistribution, so no RACE data is committed.
Rerunning the script on the same input gives the same bytes.
"""
from __future__ import annotations
import argparse, re, shutil, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_DOCS = 300                       # documents per evaluation split

# ---------------------------------------------------------------- evaluation sets
# task folder -> ([(file, rule, count)], licence/readme files copied as they are).
# 'lines': the first `count` non-empty lines (a label file is cut like its data file: the two stay aligned);
# 'tasks6': the first `count` tasks of 6 lines; 'all': the whole file.
EVAL = {
    "lambada": ([("lambada_test.jsonl", "lines", N_DOCS)], ["LICENSE.txt", "SOURCE.txt"]),
    "boolq": ([("val.jsonl", "lines", N_DOCS)], ["LICENSE.txt", "SOURCE.txt"]),
    "piqa": ([("valid.jsonl", "lines", N_DOCS), ("valid-labels.lst", "lines", N_DOCS)],
             ["README.md", "README_piqa_page.md", "SOURCE.txt"]),
    "hellaswag": ([("hellaswag_val_full.txt", "tasks6", N_DOCS)],
                  ["LICENSE", "README_klosax_hellaswag_text_data.md", "README_rowanz_data.md", "SOURCE.txt"]),
    "winogrande": ([("winogrande_dev_llmfoundry.jsonl", "lines", N_DOCS),
                    ("dev-labels.lst", "lines", N_DOCS)], ["LICENSE.txt", "README.md", "SOURCE.txt"]),
    "anli": ([("R2/dev.jsonl", "lines", N_DOCS), ("R2/test.jsonl", "lines", N_DOCS)],
             ["LICENSE.txt", "README.txt", "SOURCE.txt"]),
    # the whole dev split (638, 84 KB): the decontamination test wants more than 400 short WiC sentences
    "wic": ([("dev.data.txt", "all", 0), ("dev.gold.txt", "all", 0)],
            ["LICENSE.txt", "README.txt", "SOURCE.txt"]),
}

# ---------------------------------------------------------------- corpus
# A text file keeps its first `chars` characters (as `Path.read_text()` counts them), extended to the end of
# that line; 0 keeps the whole file. The sizes are what tests and notebooks read (tests/data/README.md lists
# them).
BOOK_FLOOR = 60_000                # nbs/05_data reads up to 60 000 characters of every book
BOOKS = {"austen-emma.txt": 220_000, "austen-persuasion.txt": 65_000, "austen-sense.txt": 200_000,
         "blake-poems.txt": 0, "chesterton-ball.txt": BOOK_FLOOR, "chesterton-brown.txt": 220_000,
         "chesterton-thursday.txt": 200_000, "melville-moby_dick.txt": 220_000,
         "milton-paradise.txt": BOOK_FLOOR, "shakespeare-caesar.txt": BOOK_FLOOR,
         "shakespeare-hamlet.txt": BOOK_FLOOR, "shakespeare-macbeth.txt": BOOK_FLOOR,
         "whitman-leaves.txt": BOOK_FLOOR}
TEXTS = {"tinyshakespeare/input.txt": 200_000, "wikitext2/test.txt": 100_000}
SPEECH_CHARS = 4_000               # each speech's opening (inaugural/2005-Bush.txt keeps its 0xa1 on line 10)
STATE_UNION_FILES = 5              # the first state-of-the-union speeches by file name
POSTS_ROWS = {"beer": 400, "coffee": 360}          # the first <row .../> lines of each Posts.xml
CORPUS_META = {"gutenberg": ["LICENSE.txt", "README", "SOURCE.txt"],
               "tinyshakespeare": ["LICENSE.txt", "SOURCE.txt"],
               "us_speeches": ["LICENSE.txt", "SOURCE.txt", "inaugural/README", "state_union/README"],
               "wikitext2": ["LICENSE.txt", "README", "SOURCE.txt"],
               "stackexchange": ["LICENSE.txt", "SOURCE.txt"]}


class FixtureError(ValueError):
    "The full data folder is not what the rules expect; the message names the file."


def _lines(b: bytes) -> list[bytes]:
    "Lines of `b`, each with its own b'\\n' (the last one may have none)."
    return [l for l in re.split(b"(?<=\n)", b) if l]


def first_lines(b: bytes, n: int) -> bytes:
    "The first `n` non-empty lines of `b` (and any blank lines between them)."
    out, kept = [], 0
    for l in _lines(b):
        if kept == n: break
        out.append(l)
        kept += bool(l.strip())
    if kept < n: raise FixtureError(f"wanted {n} lines, it has {kept}")
    return b"".join(out)


def first_chars(b: bytes, chars: int, shorter_ok: bool = False) -> bytes:
    "Whole lines of `b` until they hold `chars` characters as `read_text()` counts them (0: all of `b`)."
    if not chars: return b
    out, n = [], 0
    for l in _lines(b):
        if n >= chars: break
        out.append(l)
        n += len(l.decode("utf-8", "replace").replace("\r\n", "\n"))     # universal newlines: CRLF is 1
    if n < chars and not shorter_ok: raise FixtureError(f"wanted {chars} characters, it has {n}")
    return b"".join(out)


def first_tasks6(b: bytes, n: int) -> bytes:
    "The first `n` tasks (6 lines each) of HellaSwag's text layout."
    ls = _lines(b)
    if len(ls) < 6 * n: raise FixtureError(f"wanted {n} tasks of 6 lines, it has {len(ls) // 6}")
    return b"".join(ls[:6 * n])


def first_rows(b: bytes, n: int) -> bytes:
    "A Stack Exchange Posts.xml with its first `n` <row .../> lines, the XML header and closing tag kept."
    ls = _lines(b)
    rows = [i for i, l in enumerate(ls) if l.lstrip().startswith(b"<row ")]
    if len(rows) < n: raise FixtureError(f"wanted {n} rows, it has {len(rows)}")
    return b"".join(ls[:rows[0]] + ls[rows[0]:rows[n - 1] + 1] + ls[rows[-1] + 1:])


def _cut(src: Path, dst: Path, cut=lambda b: b, note: str | None = None):
    "Write `cut` of the bytes of `src` to `dst`; a SOURCE.txt gets a last line saying which subset this is."
    if not src.is_file():
        raise FixtureError(f"{src}: not found; pass the full data folder (holding eval/ and corpus/)")
    try: b = cut(src.read_bytes())
    except FixtureError as e: raise FixtureError(f"{src}: {e}") from None
    if note and src.name == "SOURCE.txt":
        line = f"Fixture (tests/data): {note}; made by tests/data/make_fixtures.py."
        b = b.rstrip(b"\n") + f"\n{line}\n".encode()
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(b)


def make_eval(src: Path, out: Path):
    "tests/data/eval: every task in its official layout, first documents only."
    rules = {"lines": first_lines, "tasks6": first_tasks6, "all": lambda b, n: b}
    for task, (files, meta) in EVAL.items():
        said = []
        for name, rule, n in files:
            _cut(src / task / name, out / task / name, lambda b: rules[rule](b, n))
            how = {"lines": f"first {n} lines", "tasks6": f"first {n} tasks (6 lines each)",
                   "all": "whole file"}
            said.append(f"{name}: {how[rule]}")
        for m in meta: _cut(src / task / m, out / task / m, note="; ".join(said))
    for sample in ("hans", "race"):                 # hand-written, in the official layouts
        for f in sorted(p for p in (HERE / sample).rglob("*") if p.is_file()):
            _cut(f, out / sample / f.relative_to(HERE / sample))


def make_corpus(src: Path, out: Path):
    "tests/data/corpus: the opening of each file the tests read, same names and folders."
    for name, chars in BOOKS.items():
        _cut(src / "gutenberg" / name, out / "gutenberg" / name, lambda b: first_chars(b, chars))
    for path, chars in TEXTS.items(): _cut(src / path, out / path, lambda b: first_chars(b, chars))
    sp = src / "us_speeches"
    state_union = sorted((sp / "state_union").glob("*.txt"))[:STATE_UNION_FILES]
    for p in sorted((sp / "inaugural").glob("*.txt")) + state_union:
        speech = lambda b: first_chars(b, SPEECH_CHARS, shorter_ok=True)
        _cut(p, out / "us_speeches" / p.relative_to(sp), speech)
    for site, n in POSTS_ROWS.items():
        _cut(src / "stackexchange" / site / "Posts.xml", out / "stackexchange" / site / "Posts.xml",
             lambda b: first_rows(b, n))
    to_eol = "characters, extended to the end of the line"
    sizes = ", ".join(f"{b} {c or 'all'}" for b, c in BOOKS.items())
    notes = {"gutenberg": f"each book's first N {to_eol}: {sizes}",
             "tinyshakespeare": f"input.txt: first {TEXTS['tinyshakespeare/input.txt']} {to_eol}",
             "wikitext2": f"test.txt: first {TEXTS['wikitext2/test.txt']} {to_eol}; valid.txt not included",
             "us_speeches": f"every inaugural address and the first {STATE_UNION_FILES} state-of-the-union "
                            f"speeches, each cut to its first {SPEECH_CHARS} {to_eol} (whole if shorter)",
             "stackexchange": "Posts.xml: the first "
                              + ", ".join(f"{n} rows ({site})" for site, n in POSTS_ROWS.items())
                              + ", header and closing tag kept"}
    for folder, metas in CORPUS_META.items():
        for m in metas: _cut(src / folder / m, out / folder / m, note=notes[folder])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path, help="the full data folder (holding eval/ and corpus/)")
    ap.add_argument("--out", type=Path, default=HERE, help="where eval/ and corpus/ go (default: tests/data)")
    a = ap.parse_args(argv)
    tmp = a.out / ".fixtures-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for sub in ("eval", "corpus"):
            if not (a.data / sub).is_dir(): raise FixtureError(f"{a.data / sub}: no such folder")
        make_eval(a.data / "eval", tmp / "eval")
        make_corpus(a.data / "corpus", tmp / "corpus")
    except FixtureError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"make_fixtures: {e}", file=sys.stderr)
        return 2
    for sub in ("eval", "corpus"):                   # the old fixtures go only once the new ones are complete
        shutil.rmtree(a.out / sub, ignore_errors=True)
        (tmp / sub).rename(a.out / sub)
    tmp.rmdir()
    for sub in ("eval", "corpus"):
        files = [p for p in (a.out / sub).rglob("*") if p.is_file()]
        print(f"{a.out / sub}: {len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
