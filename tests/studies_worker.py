"""The studies of tests/test_studies.py in one process: nbs/16_icl.ipynb on each of the nine paper tasks at one process,
then the ICL study (HellaSwag, RACE-h) and the bias study on one TP2 x PP2 launch (`mtnlg.session.Session`, started
once and lent to each study's notebook in turn), then the bias study's draw again on those ranks beside two busy
processes. Usage: python tests/studies_worker.py OUT DATA (OUT/one/<task>, OUT/tp2pp2/<study>, OUT/tp2pp2/ranks.json)"""
import json, subprocess, sys
from pathlib import Path
from execnb.nbio import read_nb
from execnb.shell import CaptureShell

NBS = Path(__file__).resolve().parent.parent / "nbs"
BATCH = 16                     # the ranks' scoring batch: every study at TP2 x PP2 asks this one
# 4 documents a task the layouts compare: every property checked is per document (its examples, its log-likelihoods
# at both layouts), and RACE-h's documents 4-7 still share a scored article (the control of the articles kept apart)
ICL = dict(limit=4, shots="0,1", seeds="1,2", max_orders=2)
COMPARED = ("hellaswag", "race_h")      # the tasks the ICL study runs at TP2 x PP2 too
ONE_ONLY_LIMIT = 2      # documents of the other seven tasks (one process only): each property is per document


def limit(task: str) -> int:
    "Documents `task`'s ICL study scores here: `ICL`'s limit for a task both layouts run, else `ONE_ONLY_LIMIT`."
    return ICL["limit"] if task in COMPARED else ONE_ONLY_LIMIT


STUDIES = {f"icl_{t}": ("16_icl.ipynb", dict(task=t)) for t in COMPARED}     # with ICL's settings
# one continuation a prompt: 46 rows, every prompt of every study; the sentiment intervals stay clustered by prompt
STUDIES["bias"] = ("15_bias.ipynb", dict(samples=1))
AGAIN = dict(max_new_tokens=10, do_sample=True, temperature=1.0, top_p=0.9, seed=1234, per_row=True)  # 15_bias's
# the draw again: the first batch of the study's rows (16 of 46), at every place of it; a prefix, since row i draws
# stream (seed, i)
AGAIN_ROWS = BATCH


def run_notebook(name: str, **params) -> None:
    "Run nbs/`name` here with `params` set after its parameters cell (as papermill sets them); stop at an error."
    nb = read_nb(NBS / name)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "".join(f"\n{k} = {v!r}" for k, v in params.items())
    CaptureShell(path=NBS).run_all(nb, exc_stop=True)
    print("done", name, params.get("task", ""), flush=True)


class Lent:
    "The shared ranks lent to one study: its requests go to them; its `close()` is counted and leaves them running."
    def __init__(self, ranks, closes: list):
        self.ranks, self.identity, self.closes = ranks, ranks.identity, closes
    def __getattr__(self, name): return getattr(self.ranks, name)
    def close(self): self.closes.append(1)


def weights(run) -> str:
    "The digests of a run's checkpoint (each weight file's sha256): equal for the same weights anywhere."
    return (Path(run) / "checkpoints" / "step00000000" / "digests.json").read_text()


def studies_on_shared_ranks(out: Path, data: str) -> None:
    "Each study of STUDIES at TP2 x PP2 on one launch; then the bias study's draw again, at batch 1, under load."
    import pandas as pd
    import mtnlg.session as S
    from mtnlg.generate import Sampling, demo_checkpoint
    run = demo_checkpoint(out / "tiny_run")           # what each study makes for itself without a checkpoint
    real, lent, closes = S.Session, [], []
    ranks = real(run, 2, 2, BATCH)                      # the one launch

    def session(source, tp=1, pp=1, batch_size=8, precision="fp32", step=None):
        "A study's `Session`: at 1 x 1 its own; at TP2 x PP2 the shared ranks, if they hold its weights and settings."
        if tp * pp == 1: return real(source, tp, pp, batch_size, precision, step)
        assert (tp, pp, batch_size, precision, step) == (2, 2, BATCH, "fp32", None), (tp, pp, batch_size, precision)
        assert weights(source) == weights(run), f"{source}: other weights than the shared ranks'"
        lent.append(str(source))
        return Lent(ranks, closes)

    S.Session = session                                 # the notebooks' `from mtnlg.session import Session`
    try:
        for name, (nb, params) in STUDIES.items():
            run_notebook(nb, **params, tp=2, pp=2, batch_size=BATCH, out_dir=str(out / name),
                         **(dict(ICL, data=data) if nb == "16_icl.ipynb" else {}))
    finally: S.Session = real
    model = pd.read_csv(out / "bias" / "continuations.csv", keep_default_na=False).query("model == 'model'")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    prompts = list(model.prompt)[:AGAIN_ROWS]
    try: again = ranks.generate_texts(prompts, Sampling(**AGAIN), batch_size=1)
    finally:
        for h in hogs: h.kill()
    ranks.close()
    (out / "ranks.json").write_text(json.dumps(dict(
        lent=lent, closes=len(closes), launcher_exit=ranks._ranks.proc.returncode, study_batch=BATCH,
        again=[g.text for g in again])))


def main(out: Path, data: str) -> None:
    "The ICL study on each paper task at one process (OUT/one/<task>), then the studies at TP2 x PP2 (OUT/tp2pp2)."
    from mtnlg.tasks import PAPER_TASKS
    for task in PAPER_TASKS:                            # one process: the libraries load once for all nine
        run_notebook("16_icl.ipynb", task=task, **(ICL | dict(limit=limit(task))), out_dir=str(out / "one" / task),
                     data=data)
    studies_on_shared_ranks(out / "tp2pp2", data)


if __name__ == "__main__": main(Path(sys.argv[1]), sys.argv[2])
