"""Few-shot examples never include the evaluated document (issue 26): every paper task on the committed fixtures at
1, 5 and the paper's shot count, sampled exactly as lm-eval samples while it builds the prompts."""
import pytest
from mtnlg.config import EvalError
from conftest import DATA
from mtnlg.tasks import TASKS, lm_eval_task, parse_tasks, self_shot_count, task_config, task_yaml

FIXTURES = DATA / "eval"


def _counts(data) -> list[tuple[str, int]]:
    "(task, k) for k in 1, 5 and the paper's count, at most the fixture's documents less one (HANS holds 8)."
    out = []
    for name in parse_tasks("paper", data):
        cfg = task_config(name, 0, data)
        pool = len(cfg["custom_dataset"]()[cfg["fewshot_split"]])
        out += [(name, k) for k in sorted({1, 5, TASKS[name].shots["few"]}) if k < pool]
    return out


def test_no_prompt_holds_its_own_document(fixture_data):
    data = fixture_data / "eval"
    found = {f"{name} k={k}": self_shot_count(task_config(name, k, data), k) for name, k in _counts(data)}
    assert len(found) >= 20 and all(n > 0 for n, _ in found.values()), found
    assert {key: own for key, (_, own) in found.items() if own} == {}


def test_the_check_fails_on_lm_evals_blind_draws(fixture_data):
    "Positive control: lm-eval's own arrangement (validation_split, shots from validation) leaks; ours refuses it."
    data = fixture_data / "eval"
    cfg = task_config("wic", 32, data)
    blind = {**cfg, "test_split": None, "validation_split": "validation", "fewshot_config": None}
    n, own = self_shot_count(blind, 32)
    assert n == 638 and own > 0
    # lm-eval passes no document when the pool's split is not `test_split`: the task tells the sampler (0 leaks);
    # a sampler asked with no document at all refuses rather than draw blind
    named_apart = {**cfg, "test_split": None, "validation_split": "validation"}
    assert self_shot_count(named_apart, 32) == (638, 0)
    from mtnlg.tasks import lm_eval_task
    with pytest.raises(EvalError, match="without the document being evaluated"):
        lm_eval_task(named_apart).sampler.sample(n=32)


def test_a_pool_under_another_name_is_recognised(fixture_data):
    "Evaluated documents offered as shots under another split name are still left out (content, not names)."
    import datasets
    from mtnlg.tasks import load_docs, no_self_shots
    data = fixture_data / "eval"
    cfg = task_config("piqa", 32, data)
    docs = load_docs("piqa", data)[0]["validation"]
    split = {"validation": docs[50:], "pool": docs[:100]}         # 50 documents are in both
    dd = datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in split.items()})
    blind = {**cfg, "custom_dataset": lambda **_: dd, "fewshot_split": "pool", "fewshot_config": None}
    assert self_shot_count(blind, 32)[1] > 0                        # lm-eval alone draws blind: some see themselves
    fixed = no_self_shots(dict(blind), split)
    assert self_shot_count(fixed, 32) == (250, 0)
    with pytest.raises(EvalError, match="shots"):                   # 50 documents left: too few for 60 shots
        self_shot_count(fixed, 60)


def test_race_shots_come_from_other_articles(fixture_data):
    "RACE-h by GPT-3: an article's later questions hold its earlier answers, so shots are other articles' questions."
    from lm_eval.api.samplers import ContextSampler
    from mtnlg.tasks import lm_eval_task
    t = lm_eval_task(task_config("race_h", 10, fixture_data / "eval"))
    t.set_fewshot_seed(1234)
    docs = list(t.eval_docs)
    same = lambda sampler: sum(any(s["article_id"] == d["article_id"] for s in sampler.sample(n=10, eval_doc=d))
                               for d in docs)
    assert len(docs) == 26 and same(t.sampler) == 0
    # positive control: lm-eval's own sampler (only the document itself left out) draws from the same article
    assert same(ContextSampler(list(t.fewshot_docs()), rnd=1234)) > 0


def _root_with(tmp_path, task: str, files: dict):
    "A data root holding the fixtures' `task` folder with `files` ({relative name: text}) added or replaced."
    import shutil
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / task if task != "race" else FIXTURES / "race", root / task)
    for name, text in files.items(): (root / name).write_text(text, encoding="utf-8")
    return root


def _twin_draws(cfg, k: int, seeds=range(30)) -> tuple[int, int]:
    "(draws where document 0 saw its twin 1, the same with lm-eval's own sampler): over `seeds`."
    from lm_eval.api.samplers import ContextSampler
    from mtnlg.tasks import lm_eval_task
    t = lm_eval_task(cfg)
    docs = list(t.eval_docs)
    ours = theirs = 0
    for seed in seeds:
        t.set_fewshot_seed(seed)
        ours += any(s == docs[1] for s in t.shots(docs[0], k))
        plain = ContextSampler(list(t.fewshot_docs()), rnd=seed)           # leaves out only the document itself
        theirs += any(s == docs[1] for s in plain.sample(n=k, eval_doc=docs[0]))
    return ours, theirs


def test_a_hans_twin_pair_never_sees_each_other(tmp_path):
    """A HANS row and its template twin (one noun of the premise changed, and `heuristic`, never shown): neither is the
    other's shot."""
    lines = (FIXTURES / "hans" / "heuristics_evaluation_set.txt").read_text(encoding="utf-8").splitlines()
    head, rows = lines[0], lines[1:7]
    cols = rows[0].split("\t")
    noun = cols[5].split()[1]                                    # sentence1: "The <noun> ..."
    cols2 = [c.replace(noun, "senator") if i in (1, 3, 5) else c for i, c in enumerate(cols)]
    twin = "\t".join(cols2[:8] + ["subsequence" if cols[8] != "subsequence" else "constituent"] + cols2[9:])
    root = _root_with(tmp_path, "hans", {"hans/heuristics_evaluation_set.txt": "\n".join([head, rows[0], twin, *rows[1:]]) + "\n"})
    (root / "hans" / "heuristics_train_set.txt").unlink()        # shots from the evaluated split, as without one
    cfg = task_config("hans", 4, root)
    assert cfg["fewshot_split"] == cfg["test_split"] == "test"
    docs = list(lm_eval_task_docs(cfg))
    t = lm_eval_task(cfg)
    assert t.shown(docs[0]) != t.shown(docs[1]) and docs[0]["heuristic"] != docs[1]["heuristic"]   # not the same text
    ours, theirs = _twin_draws(cfg, 4)
    assert ours == 0 and theirs > 10, (ours, theirs)        # the control: whole-document exclusion lets it in
    assert self_shot_count(cfg, 4) == (7, 0)


def test_a_hellaswag_twin_pair_never_sees_each_other(tmp_path):
    "Two HellaSwag documents with the same context and different right endings: never each other's shot."
    import json
    from mtnlg.tasks import load_docs
    docs = load_docs("hellaswag", FIXTURES)[0]["validation"][:6]
    gold = int(docs[0]["label"])
    other = (gold + 1) % 4                                   # a shared context: the same prompt, another right ending
    twin = {**docs[0], "label": str(other), "endings": [docs[2]["endings"][0] if i == gold else e
                                                        for i, e in enumerate(docs[0]["endings"])]}
    assert twin["endings"] != docs[0]["endings"]
    rows = [docs[0], twin, *docs[1:]]
    root = _root_with(tmp_path, "hellaswag", {"hellaswag/hellaswag_val.jsonl": "".join(json.dumps(r) + "\n" for r in rows)})
    cfg = task_config("hellaswag", 4, root)
    ours, theirs = _twin_draws(cfg, 4)
    assert ours == 0 and theirs > 10, (ours, theirs)
    assert self_shot_count(cfg, 4) == (7, 0)


def test_shots_from_the_training_split_else_the_evaluated_one(tmp_path):
    """PIQA with its official train files: every shot is a training document (one equal to an evaluated document left
    out for it); without them the evaluated split, the document left out; the result's identity says which."""
    import json
    from mtnlg.tasks import lm_eval_task, load_docs, shot_pool, task_identity
    lines = lambda f: (FIXTURES / "piqa" / f).read_text(encoding="utf-8").splitlines(keepends=True)
    val, labels = lines("valid.jsonl"), lines("valid-labels.lst")
    # evaluated: the first 40 dev rows; training: rows 200-299 and dev row 0 with its wrong solution changed (never
    # shown: a shot shows the goal and the right solution), so the same prompt and answer in both splits
    row0 = json.loads(val[0])
    wrong = "sol2" if labels[0].strip() == "0" else "sol1"
    twin = json.dumps({**row0, wrong: json.loads(val[1])[wrong]}) + "\n"
    files = {"piqa/valid.jsonl": "".join(val[:40]), "piqa/valid-labels.lst": "".join(labels[:40]),
             "piqa/train.jsonl": "".join(val[200:]) + twin, "piqa/train-labels.lst": "".join(labels[200:] + labels[:1])}
    root = _root_with(tmp_path, "piqa", files)
    cfg = task_config("piqa", 5, root)
    assert cfg["fewshot_split"] == "train" and shot_pool(cfg) == "train"
    train = load_docs("piqa", root)[0]["train"]
    t = lm_eval_task(cfg)
    t.set_fewshot_seed(1234)
    evaluated = list(t.eval_docs)
    drawn = [s for d in evaluated for s in t.shots(d, 50)]
    assert all(s in train for s in drawn) and not any(s in evaluated for s in drawn)
    copy = train[-1]
    assert copy != evaluated[0] and t.shown(copy) == t.shown(evaluated[0])
    assert copy not in t.shots(evaluated[0], 100)                     # its copy in train: left out for it
    assert copy in [s for d in evaluated[1:] for s in t.shots(d, 100)]  # (a shot of the others)
    ident = task_identity("piqa", 5, root)
    assert ident["pool"] == "train" and "piqa/train.jsonl" in ident["data"]
    fallback = task_config("piqa", 5, FIXTURES)
    assert fallback["fewshot_split"] == "validation" and shot_pool(fallback).startswith("validation (the evaluated")
    assert task_identity("piqa", 5, FIXTURES)["pool"] == shot_pool(fallback)


def lm_eval_task_docs(cfg):
    "The evaluated documents of task config `cfg`, as lm-eval holds them."
    from mtnlg.tasks import lm_eval_task
    return lm_eval_task(cfg).eval_docs


def test_winogrande_twins_never_enter_each_others_prompts(fixture_data):
    """The fixtures' real WinoGrande pairs (the same sentence, one or two words changed, the other answer): at the
    paper's 50 shots from the development split no document sees its twin solved, and each left-out twin is counted;
    the control: lm-eval's own sampler (only the document itself left out) puts twins in front of some documents."""
    from lm_eval.api.samplers import ContextSampler
    from mtnlg.twins import LEFT_OUT, is_twin
    cfg = task_config("winogrande", 50, fixture_data / "eval")
    t = lm_eval_task(cfg)
    t.set_fewshot_seed(1234)
    docs = list(t.eval_docs)
    pool = list(t.fewshot_docs())
    twins = {i: [p for p in pool if is_twin(t.shown(d), t.shown(p)) and t.shown(p) != t.shown(d)] for i, d in enumerate(docs)}
    paired = [i for i, ps in twins.items() if ps]
    assert len(docs) == 300 and len(paired) > 100                # real pairs in the fixture
    LEFT_OUT.pop("winogrande", None)
    leaks = lambda draw: sum(any(s in twins[i] for s in draw(docs[i])) for i in paired)
    assert leaks(lambda d: t.shots(d, 50)) == 0
    assert sum(LEFT_OUT["winogrande"].values()) == sum(len(ps) for ps in twins.values())     # counted
    plain = ContextSampler(pool, rnd=1234)
    assert leaks(lambda d: plain.sample(n=50, eval_doc=d)) > 5   # control: the leak without the exclusion


def _icl_until_the_model(tmp_path, **params):
    "Run nbs/16_icl.ipynb with `params` up to the cell that loads the model; the exception it raised, or None."
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    from conftest import ROOT
    nb = read_nb(ROOT / "nbs" / "16_icl.ipynb")
    at = next(i for i, c in enumerate(nb.cells) if "Session(source" in c.source)
    nb.cells = nb.cells[:at]
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "".join(f"\n{k} = {v!r}" for k, v in {"out_dir": str(tmp_path / "out"), **params}.items())
    sh = CaptureShell(path=ROOT / "nbs")
    try: sh.run_all(nb, exc_stop=True)
    except Exception as e: return e
    return None


def test_the_icl_study_checks_every_pool_before_the_model_loads(tmp_path):
    """RACE-h has no training split here: at limit 24 of its 26 questions experiments 2-4 have no examples, and 30 shots
    are more than experiment 1's pool; both stop before the model loads (no result written). The control: the
    study's defaults pass the same checks."""
    data = str(FIXTURES)
    few = _icl_until_the_model(tmp_path / "a", task="race_h", limit=24, data=data)
    assert isinstance(few, ValueError) and "cannot give 2" in str(few), few
    many = _icl_until_the_model(tmp_path / "b", task="race_h", limit=8, shots="0,30", data=data)
    assert isinstance(many, EvalError) and "30 shots asked" in str(many), many
    assert not (tmp_path / "a" / "out" / "eval_seed1").exists() and not (tmp_path / "b" / "out" / "eval_seed1").exists()
    assert _icl_until_the_model(tmp_path / "c", task="race_h", limit=8, data=data) is None
