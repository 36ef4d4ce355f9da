"""How long the short demo test's few-shot prompts are: each task's 5-shot prompt (longest option) per document,
in GPT-2 tokens, for the first 10 documents, against the demo model's 768-token window; so a smaller --limit can
be chosen that keeps the window check (`docs_over_window == 0`) as strong: its longest prompts still in it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/demo_window.py

lm-eval builds the prompts exactly as `mtnlg demo` does (the same task configs, seeds, shots from the same
split); nothing is scored (no model: every log-likelihood is 0). Writes benchmarks/demo_window.json.
"""
import json
from pathlib import Path
from mtnlg.config import load_config
from mtnlg.eval import MtnlgLM, evaluate_task
from mtnlg.tokenizer import get_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "eval"       # the test's evaluation sets (MTNLG_EVAL_DATA)
TASKS, SHOTS, LIMIT = ("lambada", "piqa", "hellaswag"), 5, 10


class PromptLengths(MtnlgLM):
    "lm-eval `LM` that scores nothing and records each document's longest request (context + continuation)."
    def __init__(self, tok, window):
        super().__init__(scorer=None, tokenizer=tok)
        self.window, self.longest = window, {}
    @property
    def max_length(self) -> int: return self.window
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        for r in requests:
            n = len(self.tok_encode(r.args[0] + r.args[1]))
            self.longest[r.doc_id] = max(self.longest.get(r.doc_id, 0), n)
        return [(0.0, False)] * len(requests)


def main():
    window = load_config("demo").model.seq_length
    tok, out = get_tokenizer("gpt2"), {"window": window, "shots": SHOTS, "tasks": {}}
    for name in TASKS:
        lm = PromptLengths(tok, window)
        evaluate_task(lm, name, SHOTS, limit=LIMIT, data=DATA)
        per_doc = [lm.longest[i] for i in sorted(lm.longest)]
        out["tasks"][name] = {"tokens_per_doc": per_doc,
                              "longest_of_first": {n: max(per_doc[:n]) for n in (1, 2, 3, 4, 5, 10)}}
    text = json.dumps(out, indent=1)
    (ROOT / "benchmarks" / "demo_window.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
