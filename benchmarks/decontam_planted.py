"""Every evaluation text decontamination can match (8 words or more), planted alone in a real page: how many the
rule removes, with the texts matched field by field (`mtnlg.decontam`, Megatron's rule) and with the fields of
each example joined (the rule before issue 30: PIQA goal + solutions, BoolQ passage + question); and the speed of
the matching on real text.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decontam_planted.py [--data DIR]

DIR holds eval/ (the evaluation sets in their official layouts) and corpus/; it is --data, else $MTNLG_BENCH_DATA,
else the committed fixtures tests/data (first documents of each set; pass the full folder for the whole sets).
Prints one JSON line per task, then one for the speed.
"""
import argparse, json, os, re, tempfile, time
from pathlib import Path
import numpy as np
from mtnlg import decontam as DC
from mtnlg.data import clean_text
from mtnlg.tasks import load_docs

DATA = Path(os.environ.get("MTNLG_BENCH_DATA") or Path(__file__).resolve().parents[1] / "tests" / "data")
JOINED = {"piqa": ["goal", "sol1", "sol2"], "boolq": ["passage", "question"]}     # the old rule's fields


def joined_ngrams(eval_dir: Path, rule=DC.DecontamRule()) -> dict:
    "Eval n-grams the old way: PIQA's and BoolQ's fields joined into one text an example, others field by field."
    parts = {}
    texts = [t for task, t in DC.eval_texts(eval_dir) if task not in JOINED]
    for task, fields in JOINED.items():
        for split in load_docs(task, eval_dir)[0].values():
            texts += [" ".join(d[f] for f in fields) for d in split]
    for t in texts:
        h = DC._words(t)[0]
        k = rule.max_ngram_size if len(h) >= rule.max_ngram_size else len(h)
        if k >= rule.min_ngram_size: parts.setdefault(k, []).append(DC.ngram_hashes(h, k))
    return {k: np.unique(np.concatenate(v)) for k, v in parts.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DATA))
    a = ap.parse_args()
    ev, corpus = Path(a.data) / "eval", Path(a.data) / "corpus"
    book = clean_text((corpus / "gutenberg/austen-sense.txt").read_text())
    page = book[30_000:33_000]
    at = re.compile(r"[.!?]\s").search(page, 1500).start() + 1        # after a sentence end mid-page
    with tempfile.TemporaryDirectory() as td:
        t0 = time.time()
        rules = {"field by field": DC.eval_ngrams(ev, cache_dir=td), "joined": joined_ngrams(ev)}
        build_s = time.time() - t0
    assert all(DC.decontaminate_text(page, ng)[1] == 0 for ng in rules.values())   # the page alone: no match
    for task in ("piqa", "boolq", "wic", "lambada"):
        texts = [t for t in dict.fromkeys(t for k, t in DC.eval_texts(ev) if k == task) if len(DC._words(t)[0]) >= 8]
        row = {"task": task, "texts_8plus_words": len(texts),
               "of_them_8_to_12_words": sum(len(DC._words(t)[0]) < 13 for t in texts)}
        for name, ng in rules.items():
            removed = 0
            for t in texts:
                pieces, hits = DC.decontaminate_text(f"{page[:at]} {t}{page[at:]}", ng)
                removed += bool(hits) and t not in " ".join(pieces)
            row[f"removed_{name.replace(' ', '_')}"] = removed
        print(json.dumps(row))
    text = "\n\n".join(clean_text(p.read_text(errors="replace")) for p in sorted((corpus / "gutenberg").glob("*-*.txt")))
    ng = rules["field by field"]
    t0 = time.process_time(); DC.decontaminate_text(text, ng); cut_s = time.process_time() - t0
    t0 = time.process_time(); DC.ngram_hits(text, ng); count_s = time.process_time() - t0
    mb = len(text.encode()) / 1e6
    print(json.dumps({"eval_ngrams": int(sum(map(len, ng.values()))), "eval_ngrams_build_s": round(build_s, 2),
                      "text_MB": round(mb, 2), "cut_MB_per_cpu_s": round(mb / cut_s, 2),
                      "count_MB_per_cpu_s": round(mb / count_s, 2)}))


if __name__ == "__main__":
    main()
