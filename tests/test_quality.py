"""Quality filter tested non-circularly; GPT-3's Pareto rule; bounded classifier training; datatrove's steps."""
import collections, html, json, random, re
from pathlib import Path
import numpy as np
import pytest

from mtnlg import data as D
from mtnlg.config import DataError

C = Path(__file__).parent / "data" / "corpus"


def _book(name, start, stop, size=2000):
    t = (C / "gutenberg" / name).read_text(errors="replace")
    return [t[i:i + size] for i in range(start, min(stop, len(t)) - size + 1, size)]


def _posts(site, min_chars=200):
    rows = re.findall(r'Body="([^"]*)"', (C / "stackexchange" / site / "Posts.xml").read_text())
    return [t for t in (D.html_to_text(html.unescape(b)) for b in rows) if len(t) > min_chars]


def _wiki():
    "WikiText-2 test paragraphs of 400+ characters, in file order."
    return [p.strip() for p in re.split(r"\n \n", (C / "wikitext2/test.txt").read_text()) if len(p.strip()) > 400]


def _boilerplate(words, n, seed=0):
    "Navigation bars and keyword lists of real words (a stated construction, no classifier involved)."
    rng, out = random.Random(seed), []
    for i in range(n):
        if i % 2 == 0:
            items = [w.capitalize() for w in rng.sample(words, 60)]
            out.append("\n".join(" | ".join(items[j:j + 6]) for j in range(0, 60, 6))
                       + "\nCopyright 2024. All rights reserved. Privacy Policy | Terms of Use | Contact Us")
        else: out.append("Tags: " + ", ".join(rng.sample(words, 150)))
    return out


@pytest.fixture(scope="module")
def split():
    """Training set as the paper's (curated sources vs web); held-out pages chosen by source, not by a classifier.

    train good: Emma, Father Brown, Moby-Dick (first 200,000 characters, 2,000-character pages) and the first
    half of WikiText-2's paragraphs; train web: coffee.stackexchange posts. held-out high: other books
    (Persuasion, The Man Who Was Thursday, Julius Caesar), the other half of WikiText-2, inaugural speeches.
    held-out low: posts of another site (beer.stackexchange) and navigation bars / keyword lists built from the
    real words of a held-out book.
    """
    wiki = _wiki()
    good = [p for b in ("austen-emma.txt", "chesterton-brown.txt", "melville-moby_dick.txt")
            for p in _book(b, 0, 200_000)] + wiki[:len(wiki) // 2]
    web = _posts("coffee")
    persuasion = _book("austen-persuasion.txt", 0, 65_000)
    speeches = [p.read_text(errors="replace")[:2000] for p in sorted((C / "us_speeches/inaugural").glob("*.txt"))]
    high = {"persuasion": persuasion, "thursday": _book("chesterton-thursday.txt", 0, 80_000),
            "caesar": _book("shakespeare-caesar.txt", 0, 40_000), "wikitext (2nd half)": wiki[len(wiki) // 2:],
            "inaugural speeches": speeches}
    words = sorted(set(re.findall(r"[a-z]{4,}", " ".join(persuasion).lower())))
    low = {"beer.stackexchange": _posts("beer")[:200], "navigation/keywords": _boilerplate(words, 40)}
    assert not set(good) & {t for v in high.values() for t in v}
    assert not set(web) & set(low["beer.stackexchange"])
    return good, web, high, low


def _precision_recall(qc, high, low, threshold=0.5):
    "Precision and recall of 'keep' (score >= threshold) with held-out high pages as the positives."
    hs, ls = qc.score([t for v in high.values() for t in v]), qc.score([t for v in low.values() for t in v])
    tp, fp = int((hs >= threshold).sum()), int((ls >= threshold).sum())
    return tp / max(1, tp + fp), tp / len(hs)


def test_quality_classifier_on_held_out_pages(split):
    "Trained as the paper does; judged on held-out pages chosen by source: precision and recall of 'keep'."
    good, web, high, low = split
    qc = D.QualityClassifier().fit(good, web)
    precision, recall = _precision_recall(qc, high, low)
    for name, texts in {**high, **low}.items():
        print(f"{name:22s} {len(texts):4d} pages, kept {(qc.score(texts) >= 0.5).mean():.2f}")
    print(f"held out: {sum(map(len, high.values()))} high, {sum(map(len, low.values()))} low pages; "
          f"keep precision {precision:.3f}, recall {recall:.3f}")
    assert precision >= 0.9 and recall >= 0.9
    # control: the same features and data with the labels shuffled cannot pass the same floors
    labels = np.random.default_rng(0).permutation(np.array([1] * len(good) + [0] * len(web)))
    texts = good + web
    shuffled = D.QualityClassifier().fit([t for t, y in zip(texts, labels) if y],
                                         [t for t, y in zip(texts, labels) if not y])
    p0, r0 = _precision_recall(shuffled, high, low)
    print(f"control (shuffled labels): precision {p0:.3f}, recall {r0:.3f}")
    assert p0 < 0.9 or r0 < 0.9


def test_pareto_rule_keeps_the_expected_fraction(split):
    "GPT-3's rule: P(keep) = P(pareto(alpha) > 1 - s) = (2 - s)^-alpha; the draws are seeded per document text."
    good, web, high, low = split
    qc = D.QualityClassifier().fit(good, web)
    pages = [t for v in (*high.values(), *low.values()) for t in v]
    scores = qc.score(pages)
    for alpha in (9, 2):
        docs = [{"id": f"page{i}", "source": "web", "text": t} for i, t in enumerate(pages)]
        stats = {"web": collections.Counter()}
        kept = {d["id"] for d in D.quality_filter(docs, stats, qc, pareto_alpha=alpha, seed=1)}
        p = D.pareto_keep_probability(scores, alpha)
        expected, sd = p.sum(), np.sqrt((p * (1 - p)).sum())
        print(f"alpha {alpha}: kept {len(kept)} of {len(pages)}, expected {expected:.1f} +/- {sd:.1f}")
        assert abs(len(kept) - expected) < 3 * sd and stats["web"]["low_quality"] == len(pages) - len(kept)
        # the same documents again, in another order: the same decisions (no shared random stream)
        again = {d["id"] for d in D.quality_filter(docs[::-1], stats, qc, pareto_alpha=alpha, seed=1)}
        assert again == kept
    assert kept != {d["id"] for d in D.quality_filter(docs, stats, qc, pareto_alpha=2, seed=2)}   # another seed
    above = {f"page{i}" for i in np.flatnonzero(scores > 0.5)}
    assert kept & above and kept - above          # alpha 2 keeps pages on both sides of 0.5


def test_pareto_same_documents_at_any_task_count(tmp_path, split):
    "A run with quality_pareto_alpha keeps the same documents at tasks=1 and tasks=3, and the same as `curate`."
    from mtnlg.curation import CurationRun, curate_run
    good, web, high, low = split
    qc = D.QualityClassifier().fit(good, web)
    pages = [t for v in (*high.values(), *low.values()) for t in v][::3]
    folder = tmp_path / "web"
    folder.mkdir()
    for f in range(6):          # six files: six units of work, dealt to the tasks round-robin
        (folder / f"{f}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in pages[f::6]))
    src = [D.Source("web", str(folder), quality_filter=True)]
    kept = {}
    for tasks in (1, 3):
        run = CurationRun(src, str(tmp_path / f"run{tasks}"), tasks=tasks, quality_pareto_alpha=9)
        rep = curate_run(run, qc, workers=2, log=None)
        kept[tasks] = [json.loads(l)["id"] for l in (tmp_path / f"run{tasks}/curated/web.jsonl").open()]
        assert rep["sources"]["web"]["scored"] == len(pages) and rep["run"]["quality_pareto_alpha"] == 9
    one = D.curate(src, tmp_path / "one", quality=qc, quality_pareto_alpha=9, seed=1, log=None)
    assert kept[1] == kept[3] == [json.loads(l)["id"] for l in (tmp_path / "one/web.jsonl").open()]
    assert 0 < len(kept[1]) < len(pages)
    assert one["sources"]["web"]["low_quality"] == len(pages) - len(kept[1])
    with pytest.raises(DataError, match="quality_pareto_alpha=0"):
        curate_run(CurationRun(src, str(tmp_path / "bad"), quality_pareto_alpha=0), qc, log=None)


def test_classifier_training_holds_a_bounded_sample(tmp_path, capsys):
    "--quality-good/--quality-web stream through a reservoir of --quality-max-docs documents a class."
    import argparse
    from mtnlg.corpus import cli_parser, cli_run, reservoir_sample, train_quality_classifier
    books = [p for b in ("austen-emma.txt", "melville-moby_dick.txt") for p in _book(b, 0, 200_000)]
    posts = _posts("coffee")
    (tmp_path / "good.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in books))
    (tmp_path / "web.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in posts))
    qc = train_quality_classifier([D.Source("g", str(tmp_path / "good.jsonl"))],
                                  [D.Source("w", str(tmp_path / "web.jsonl"))], max_docs=40, log=None)
    assert qc.trained_on == {"good": [40, len(books)], "web": [40, len(posts)]} and len(books) > 40
    whole = train_quality_classifier([D.Source("g", str(tmp_path / "good.jsonl"))],
                                     [D.Source("w", str(tmp_path / "web.jsonl"))], max_docs=10_000, log=None)
    assert whole.trained_on == {"good": [len(books)] * 2, "web": [len(posts)] * 2}     # control: all held
    # memory: documents alive at once (k held + the one in hand), counted by the documents; control: all held
    class Doc(str):
        alive = most = 0
        def __new__(cls, text):
            Doc.alive += 1
            Doc.most = max(Doc.most, Doc.alive)
            return super().__new__(cls, text)
        def __del__(self): Doc.alive -= 1
    docs = lambda: (Doc(f"doc {i} " + "word " * 600) for i in range(4000))
    held, seen = reservoir_sample(docs(), 50, seed=3)
    sampled_most, Doc.most = Doc.most, 0
    whole = list(docs())
    assert (len(held), seen) == (50, 4000) and sampled_most <= 52 and Doc.most >= len(whole) == 4000
    stream = lambda: (f"doc {i} " + "word " * 600 for i in range(4000))
    # uniform: every position of the stream has the same chance (mean index of the held near the middle)
    means = [np.mean([int(h.split()[1]) for h in reservoir_sample(stream(), 50, seed=s)[0]]) for s in range(20)]
    assert abs(np.mean(means) - 2000) < 150
    # the CLI: flags reach the classifier's training and the filter
    ap = cli_parser(argparse.ArgumentParser(prog="mtnlg data"))
    args = ap.parse_args(["curate", f"web+q={tmp_path / 'web.jsonl'}", "--out", str(tmp_path / "cur"),
                          "--quality-good", f"g={tmp_path / 'good.jsonl'}",
                          "--quality-web", f"w={tmp_path / 'web.jsonl'}", "--quality-max-docs", "30",
                          "--quality-pareto-alpha", "9", "--executor", "single"])
    assert cli_run(args) == 0
    assert f"30 of {len(books)} good and 30 of {len(posts)} web documents" in capsys.readouterr().out
    rep = json.loads((tmp_path / "cur/report.json").read_text())["sources"]["web"]
    assert rep["scored"] == len(posts) and 0 < rep["low_quality"] < len(posts)   # Pareto keeps a few web posts
    with pytest.raises(DataError, match="max_docs=2"):
        train_quality_classifier([], [], max_docs=2, log=None)


def test_datatrove_megatron_tokenizer_writes_the_same_dataset(tmp_path):
    "datatrove's MegatronDocumentTokenizer with the offline GPT-2 tokenizer.json: our .bin/.idx, byte for byte."
    from datatrove.data import Document
    from datatrove.pipeline.tokens import MegatronDocumentTokenizer
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from mtnlg.indexed import indexed_writer, token_dtype
    from mtnlg.tokenizer import get_tokenizer, gpt2_tokenizers_json
    tok = get_tokenizer("gpt2")
    texts = _book("austen-persuasion.txt", 0, 40_000) + _posts("beer")[:20] + ["a page quoting <|endoftext|>"]
    hf_json = gpt2_tokenizers_json(tmp_path / "gpt2.json")
    step = MegatronDocumentTokenizer(str(tmp_path / "dt"), tokenizer_name_or_path=str(hf_json),
                                     eos_token="<|endoftext|>")
    list(step.run(iter([Document(text=t, id=str(i)) for i, t in enumerate(texts)]), rank=0, world_size=1) or [])
    ds = IndexedDataset(str(tmp_path / "dt/00000_tokens"))
    assert len(ds) == len(texts) and all(list(ds[i]) == tok.tokenize(t) + [tok.eod] for i, t in enumerate(texts))
    with indexed_writer(tmp_path / "ours", token_dtype(tok.vocab_size)) as b:
        for t in texts:
            ids = np.asarray(tok.tokenize(t) + [tok.eod], dtype=np.int64)
            b.add_document(ids, [len(ids)])
    for ext in ("bin", "idx"):
        assert (tmp_path / f"dt/00000_tokens.{ext}").read_bytes() == (tmp_path / f"ours.{ext}").read_bytes()


def test_datatrove_minhash_estimates_jaccard_like_ours():
    "MinhashDedupSignature's 9 x 13 hashes estimate near-duplicates' Jaccard as well as FuzzyDeduper's 128."
    from datatrove.pipeline.dedup import MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Whitespace(WordTokenizer):
        "Words split on whitespace: datatrove's English default wants spacy."
        def word_tokenize(self, text, language=None): return text.split()
        def sent_tokenize(self, text, language=None): return re.split(r"(?<=[.!?])\s+", text)
        def span_tokenize(self, text, language=None): return [m.span() for m in re.finditer(r"\S+", text)]

    dt = MinhashDedupSignature("unused", config=MinhashConfig(n_grams=5, num_buckets=9, hashes_per_bucket=13),
                               language=Whitespace())
    fz = D.FuzzyDeduper(0.8, 128, 5, 1)
    sig = lambda t: np.array(sum(dt.get_signature(dt.get_shingles(t)), []), dtype=np.uint64)
    shingles = lambda t: {" ".join(w[i:i + 5]) for w in [re.findall(r"\w+", t.lower())] for i in range(len(w) - 4)}
    pages, rng = _book("austen-sense.txt", 0, 200_000, 3000), np.random.default_rng(0)
    err = {"ours": [], "datatrove": []}
    for i in rng.choice(len(pages), 40, replace=False):
        w = pages[i].split()
        k = int(rng.integers(15, 60))
        w[::k] = ["CHANGED"] * len(w[::k])
        a, b = pages[i], " ".join(w)
        true = len(shingles(a) & shingles(b)) / len(shingles(a) | shingles(b))
        err["ours"].append((fz.signature(a).hashvalues == fz.signature(b).hashvalues).mean() - true)
        err["datatrove"].append((sig(a) == sig(b)).mean() - true)
    for k, e in err.items(): print(f"{k}: estimated - true Jaccard: mean {np.mean(e):+.3f}, sd {np.std(e):.3f}")
    assert all(abs(np.mean(e)) < 0.03 and np.std(e) < 0.06 for e in err.values())
