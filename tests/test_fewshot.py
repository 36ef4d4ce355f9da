"""Few-shot examples never include the evaluated document (issue 26): every paper task on the committed fixtures at
1, 5 and the paper's shot count, sampled exactly as lm-eval samples while it builds the prompts."""
import pytest
from mtnlg.config import EvalError
from mtnlg.tasks import TASKS, parse_tasks, self_shot_count, task_config, task_yaml


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
    with pytest.raises(EvalError, match="without the document being evaluated"):
        self_shot_count({**cfg, "test_split": None, "validation_split": "validation"}, 32)


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
