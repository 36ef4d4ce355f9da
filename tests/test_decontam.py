"""Tests of mtnlg.decontam: Megatron's filter_ngrams.py rules on real pages and the fixture evaluation sets."""
import collections, re
import numpy as np
import pytest

from mtnlg import decontam as DC
from mtnlg.config import DataError
from mtnlg.data import clean_text
from mtnlg.tasks import load_docs


@pytest.fixture(scope="module")
def ng(fixture_data, tmp_path_factory):
    return DC.eval_ngrams(fixture_data / "eval", cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def book(fixture_data):
    return clean_text((fixture_data / "corpus/gutenberg/austen-sense.txt").read_text())


def _nwords(t): return len(re.findall(r"\w+", t))


def _plant(page, text, at):
    "`page` with `text` after the first sentence end at or after `at`; (page, start of text)."
    i = re.compile(r"[.!?]\s").search(page, at).start() + 1
    return f"{page[:i]} {text}{page[i:]}", i + 1


def _whole(t):
    "The hash of text `t` as one n-gram of its words."
    h = DC._words(t)[0]
    return DC.ngram_hashes(h, len(h))[0]


def test_each_field_alone_short_ones_whole(fixture_data, ng):
    "PIQA goals and BoolQ questions are matched alone: of 8-12 words as one whole n-gram, longer ones by 13-grams."
    goals = [d["goal"] for d in load_docs("piqa", fixture_data / "eval")[0]["validation"]]
    questions = [d["question"] for d in load_docs("boolq", fixture_data / "eval")[0]["validation"]]
    texts = [t for task, t in DC.eval_texts(fixture_data / "eval") if task in ("piqa", "boolq")]
    assert texts == [t.strip() for t in questions + goals]                 # the task order: boolq before piqa
    short = [t for t in goals + questions if 8 <= _nwords(t) < 13]
    assert len(short) > 400 and all(_whole(t) in ng[_nwords(t)] for t in short)
    long_goal = next(t for t in goals if _nwords(t) >= 13)
    assert np.isin(DC.ngram_hashes(DC._words(long_goal)[0], 13), ng[13]).all()
    seven = next(t for t in goals + questions if _nwords(t) == 7)         # under 8 words: nothing
    assert _whole(seven) not in ng.get(7, np.zeros(0, np.uint64)) and set(ng) == set(range(8, 14))
    with pytest.raises(DataError, match="min_ngram_size <= max_ngram_size"):
        DC.eval_ngrams(fixture_data / "eval", DC.DecontamRule(min_ngram_size=14))


def test_cut_extends_to_sentence_ends(fixture_data, ng, book):
    "A match is cut with 200 characters each side, extended to the previous and the next sentence end."
    goal = next(d["goal"] for d in load_docs("piqa", fixture_data / "eval")[0]["validation"]
                if 8 <= _nwords(d["goal"]) < 13)
    page = book[30_000:33_000]
    assert DC.decontaminate_text(page, ng) == ([page], 0)
    text, s = _plant(page, goal, 1500)
    e = s + len(goal)
    a = s - 200
    while text[a] not in ".!?": a -= 1                                      # back to a sentence end ...
    b = e + 200
    while text[b] not in ".!?": b += 1                                      # ... and on to the next one
    assert a < s - 200 and b > e + 200                                      # the cut does extend past 200
    assert DC.decontaminate_text(text, ng) == ([text[:a + 1].strip(), text[b + 1:].strip()], 1)
    margin = DC.DecontamRule(remove_char_each_side=0)                       # no margin: the goal's own sentence
    pieces, _ = DC.decontaminate_text(text, ng, margin)
    assert goal not in " ".join(pieces) and len(text) - sum(map(len, pieces)) < len(goal) + 100


def test_document_in_more_than_10_pieces_dropped(fixture_data, ng, book):
    "10 matches, the first at the start, leave 10 pieces: kept; 11 leave 11: the document is dropped."
    wic = [t for t in (d["sentence1"] for d in load_docs("wic", fixture_data / "eval")[0]["validation"])
           if 8 <= _nwords(t) < 13]

    def page(k):
        parts, at = [], 40_000
        for t in wic[:k]:
            stop = re.compile(r"[.!?]\s").search(book, at + 1000).start() + 1
            parts.append(t + book[at:stop]); at = stop
        return " ".join(parts)
    ten, eleven = DC.decontaminate_text(page(10), ng), DC.decontaminate_text(page(11), ng)
    assert (len(ten[0]), ten[1]) == (10, 10) and all(len(p) > 200 for p in ten[0])
    assert eleven == ([], 11)
    assert len(DC.decontaminate_text(page(11), ng, DC.DecontamRule(splits_count=11))[0]) == 11


def test_frequency_pass_counts_documents(fixture_data, ng, book, tmp_path):
    "An 8-word eval sentence in 10 documents is left alone, in 9 it is cut; a document counts once."
    hyp = next(t for t in (d["hypothesis"] for d in load_docs("anli_r2", fixture_data / "eval")[0]["test_r2"])
               if _nwords(t) == 8)
    pages = [book[i * 3000:(i + 1) * 3000] for i in range(20, 40)]
    quoting = [_plant(p, hyp, 1500)[0] for p in pages]
    many = _plant(pages[19], " ".join([hyp] * 12), 1500)[0]                # one document, 12 times
    for docs, cut in ((quoting[:10] + pages[10:], False), (quoting[:9] + pages[9:], True),
                      (quoting[:8] + pages[8:19] + [many], True)):
        counts = DC.NgramCounts()
        for p in docs: counts.add(DC.ngram_hits(p, ng))
        used = DC.below_threshold(ng, counts, 10)
        hit = [DC.decontaminate_text(p, used)[1] > 0 for p in docs]
        assert sum(hit) == (sum(hyp in p for p in docs) if cut else 0), (len(docs), cut)
    # counts of two tasks, saved and loaded, add up to those of one
    one, halves = DC.NgramCounts(), [DC.NgramCounts(), DC.NgramCounts()]
    for i, p in enumerate(quoting[:10]): one.add(DC.ngram_hits(p, ng)); halves[i % 2].add(DC.ngram_hits(p, ng))
    for i, h in enumerate(halves): h.save(tmp_path / f"{i}.npz")
    total = DC.NgramCounts.load(tmp_path / "0.npz").update(DC.NgramCounts.load(tmp_path / "1.npz"))
    k = _nwords(hyp)
    assert [dict(zip(*c.merged()[k])) for c in (one, total)] == [{_whole(hyp): 10}] * 2
    assert [len(h.frequent(10).get(k, [])) for h in halves] == [0, 0] and len(total.frequent(10)[k]) == 1


def test_decontaminate_stream(fixture_data, ng, book):
    "Pieces become documents `<id>#<i>`; per source: contaminated, matches, dropped."
    lam = load_docs("lambada", fixture_data / "eval")[0]["test"][0]["text"]
    page = book[50_000:53_000]
    texts = [page, _plant(page, lam, 1500)[0], "tiny " * 10 + lam + " tiny" * 10]   # a piece <= 200: dropped
    docs = [{"id": i, "source": "s", "text": t} for i, t in zip("abc", texts)]
    stats = collections.defaultdict(collections.Counter)
    out = list(DC.decontaminate(docs, stats, ng))
    assert [d["id"] for d in out] == ["a", "b#0", "b#1"]
    assert not any(w in " ".join(d["text"] for d in out) for w in (lam[:60], lam[-60:]))   # the whole passage
    assert (stats["s"]["contaminated"], stats["s"]["contam_dropped"]) == (2, 1)
    assert stats["s"]["contam_matches"] > 2
