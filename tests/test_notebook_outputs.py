"""Committed notebook outputs are what a reader compares with their own run: they show no wall time, rate, date
or temporary folder that changes from run to run (a run prints how long it took only with `mtnlg --verbose`;
timings that matter are recorded by benchmarks/ in RESULTS.md). Durations a notebook computes, not measures
(the planner's predictions, the paper's figures, a setting's value) are named in COMPUTED with the cell that
prints them, and such a cell reads no clock. The scan reads the committed files only: no notebook is executed."""
import copy, json, re
from pathlib import Path
from conftest import ROOT

NBS = ROOT / "nbs"
# What changes from one run to the next, as printed: durations, rates, timing fields, dates and clock times, and
# temporary folders (tempfile's random names, and `<tmp>`: docs/build.py's stand-in for one). A notebook's
# scratch folder is `../.build/nbs/<notebook>`: the same every run, shown as `<repo>/.build/nbs/...`.
VARYING = {
    "a duration": r"(?<![\w.])\d+(?:\.\d+)?[ ]?(?:ms|s|sec|secs|seconds?|min|minutes?|h|hours?)\b",
    "a rate": r"(?<![\w.])\d[\d,.]*[ ]?(?:it|tok|tokens|samples|docs|documents|[KMGT]i?B)/s\b",
    "a timing field": r"['\"]\w*(?:seconds|_s|_per_s)['\"]:\s*[-\d.]",
    "a date": r"\b20\d\d-[01]\d-[0-3]\d\b|\b20\d\d[01]\d[0-3]\d[-_T]\d{6}\b",
    "a temporary path": r"<tmp>|(?<![\w<])/tmp/[^\s'\"]*|\btmp[a-z0-9_]{6,}\b|/var/folders/|/private/var/"
                        r"|pytest-of-",
}
PATTERN = re.compile("|".join(f"(?P<k{i}>{p})" for i, p in enumerate(VARYING.values())))
KINDS = list(VARYING)
# Cells whose printed durations are computed, the same every run: (notebook, text of the cell's source) -> why
COMPUTED = {
    ("01_memory", "lost_per_save_async_s"): "the planner's checkpoint write and stall times",
    ("01_memory", "PAPER_RUNS = {"): "the paper's iteration times (Table 1), the FLOPs' time",
    ("01_memory", "predict_time("): "the planner's predicted iteration times beside the paper's",
    ("01c_resilience", "checkpoint_schedule("): "the Young/Daly interval from the plan and its settings",
    ("01c_resilience", "schedule_lines("): "the Young/Daly interval from the plan and its settings",
    ("04a_checkpoint_folders", "rank_checkpoint_bytes"): "a 530B checkpoint's read times at a bandwidth",
    ("04b_checkpoint", "fs_gb_per_s=250"): "a 530B checkpoint's write times at an assumed bandwidth",
    ("09_jobs", "checkpoint_cost(cfg530)"): "a 530B checkpoint's write time at an assumed bandwidth",
    ("09_jobs", "render_sbatch(TESTNB"): "--time and --requeue-grace, and errors naming them",
    ("05b_curation", "steps_mb_per_cpu_s"): "a scale estimate from the throughputs recorded in RESULTS.md",
    ("02_topology", "a-launch-of-three"): "the start-up wait the cell sets (1 s), named in its error",
    ("00_config", "half an hour"): "the start-up wait: its default and the value the cell sets",
}
# Outputs of notebooks remade outside the suite (`make outputs STEMS=12_demo_report`) that still show a run's
# timings: (notebook, text of the cell's source) -> what to change there; the entry goes when the cell is fixed.
PENDING: dict = {}      # (stem, marker) -> why a cell still prints a duration: none left
CLOCK = re.compile(r"\btime\.(?:time|perf_counter|monotonic)(?:_ns)?\(|\bdatetime\.(?:now|today)\(")


def output_texts(cell) -> list[str]:
    "The text of a code cell's outputs as a reader sees it: streams, results, displays (text, markdown, HTML)."
    out = []
    for o in cell.get("outputs", []):
        if "text" in o: out.append("".join(o["text"]))
        for kind, v in o.get("data", {}).items():
            if kind.startswith("text/"): out.append("".join(v) if isinstance(v, list) else v)
        if o.get("output_type") == "error": out.append(f"{o.get('ename')}: {o.get('evalue')}")
    return out


def computed(stem: str, source: str) -> str | None:
    "Why the cell's durations are computed (COMPUTED) or not yet removed (PENDING), or None."
    entries = {**COMPUTED, **PENDING}.items()
    return next((why for (s, marker), why in entries if s == stem and marker in source), None)


def varying(stem: str, nb: dict) -> list[str]:
    "Where notebook `stem`'s committed outputs show what changes run to run: one line each."
    bad = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code": continue
        source = "".join(cell["source"])
        allowed = computed(stem, source) and not CLOCK.search(source)
        for text in output_texts(cell):
            for m in PATTERN.finditer(text):
                kind = KINDS[int(m.lastgroup[1:])]
                if allowed and kind in ("a duration", "a rate", "a timing field"): continue
                line = text[text.rfind("\n", 0, m.start()) + 1:].split("\n")[0]
                bad.append(f"nbs/{stem}.ipynb cell {i + 1}: {kind} {m.group()!r} in {line[:160]!r}")
    return bad


def notebooks() -> dict:
    return {p.stem: json.loads(p.read_text()) for p in sorted(NBS.glob("*.ipynb"))}


def test_committed_outputs_show_nothing_that_changes_run_to_run():
    """Every notebook's committed outputs (the lead's 11_train_job and 12_demo_report too) are free of timings,
    dates and temporary paths; each COMPUTED and PENDING entry names a cell printing a duration, no clock."""
    nbs = notebooks()
    assert len(nbs) >= 40 and "11_train_job" in nbs and "12_demo_report" in nbs
    bad = [line for stem, nb in nbs.items() for line in varying(stem, nb)]
    assert not bad, "run-to-run values in committed outputs (print them only with --verbose):\n" + "\n".join(bad)
    for (stem, marker), why in {**COMPUTED, **PENDING}.items():     # an entry that matches no more: removed
        cells = [c for c in nbs[stem]["cells"] if c["cell_type"] == "code" and marker in "".join(c["source"])
                 and not CLOCK.search("".join(c["source"]))]
        assert any(PATTERN.search(t) for c in cells for t in output_texts(c)), \
            f"{stem}/{marker!r}: no cell with it prints a duration without reading a clock ({why}): remove it"


def test_the_scan_catches_a_planted_timing_and_temporary_path():
    """Controls: a timing, a rate, a timing field, a date and a temporary folder planted in committed outputs are
    each found; a clock read in a COMPUTED cell makes its durations count; a folder in `<repo>` does not."""
    nb = notebooks()["00_config"]
    assert varying("00_config", nb) == []
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and c.get("outputs"))
    planted = {"took 3.2 s": "a duration", "12 ms a step": "a duration",
               "piqa 0-shot: 0.4 (acc_norm, n=20, 0.665 s)": "a duration", "1,640,870 tokens/s": "a rate",
               "{'seconds': 0.263}": "a timing field", "run 2026-11-29 10:45": "a date",
               "runs/x/20261129-051425": "a date", "wrote /tmp/tmpab12cd/run.json": "a temporary path",
               "tmpab12cd_x1": "a temporary path", "resuming from <tmp>/b/step00000003": "a temporary path"}
    for text, kind in planted.items():
        bad_nb = copy.deepcopy(nb)
        c = next(x for x in bad_nb["cells"] if x.get("source") == cell["source"])
        c["outputs"].append({"output_type": "stream", "name": "stdout", "text": [text + "\n"]})
        bad = varying("00_config", bad_nb)
        assert len(bad) == 1 and kind in bad[0] and "00_config.ipynb cell" in bad[0], (text, bad)
    fine = {"resuming from <repo>/.build/nbs/06_train/resume/b/step00000003", "tmp_path", "TMP/x.jsonl",
            "8 shots", "seed 20261129", "tp 2, pp 19", "5-shot: 0.5000 (acc, n=20)", "#SBATCH --time=04:00:00"}
    for text in fine:
        ok_nb = copy.deepcopy(nb)
        next(x for x in ok_nb["cells"] if x.get("source") == cell["source"])["outputs"].append(
            {"output_type": "stream", "name": "stdout", "text": [text + "\n"]})
        assert varying("00_config", ok_nb) == [], text
    # a COMPUTED cell is exempt only while it reads no clock
    memory = notebooks()["01_memory"]
    assert varying("01_memory", memory) == []
    c = next(x for x in memory["cells"] if x["cell_type"] == "code" and "predicted" in "".join(x["source"]))
    c["source"] = ["import time; t0 = time.perf_counter()\n"] + c["source"]
    assert any("a duration" in b for b in varying("01_memory", memory))


def test_a_run_prints_its_timings_only_when_asked(tmp_path, monkeypatch):
    """The library's own log line (a folder source fetched) names no duration by default, and its time with
    `mtnlg --verbose` ($MTNLG_VERBOSE=1, the control): the same line but for the timing."""
    from mtnlg.corpus import fetch_demo_sources
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("A note of a few words, long enough to be kept as a document. " * 5)
    lines = {}
    for verbose in ("0", "1"):
        monkeypatch.setenv("MTNLG_VERBOSE", verbose)
        said = []
        fetch_demo_sources(tmp_path / f"cache{verbose}", sources=str(tmp_path / "notes"), log=said.append)
        assert len(said) == 1 and " -> " in said[0], said
        lines[verbose] = said[0].split(" -> ")[0]                 # without the file it wrote (here: under /tmp)
    assert lines["0"] == "fetched demo source notes: 1 documents" and not PATTERN.search(lines["0"])
    assert re.fullmatch(r"fetched demo source notes: 1 documents in \d+\.\d s", lines["1"]), lines["1"]
    assert PATTERN.search(lines["1"]) and not PATTERN.search(re.sub(r" in \d+\.\d s", "", lines["1"]))
