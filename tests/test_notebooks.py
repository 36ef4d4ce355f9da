"""Every notebook in nbs/ is committed with its outputs, and they are what it makes: each is executed once here, in a
new kernel as nbdev's test runner would (`#| eval: false` cells are not run; the kernel forked from a zygote that has
imported torch, docs/warm_kernel.py, and checked to start as a fresh one), and compared cell by cell with what
is committed (docs/build.py: `make outputs` writes them). A notebook too slow for the suite carries the outputs
`make outputs` made and a fingerprint of what made them (docs/outputs.json), checked here."""
import json, os, re, shutil, sys
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import build as docs_build       # docs/build.py
import warm_kernel               # docs/warm_kernel.py

NOTEBOOKS = [p for p in docs_build.notebooks() if p.stem not in docs_build.OUTSIDE_SUITE]
# Notebooks executed here on another CPU path than the one that made their committed outputs: torch's scalar kernels
# (no AVX) and MKL's compatible code path sum in other orders, as another machine's CPU does. Their printed numbers
# differ in the last digits from the committed ones, and the comparison must pass all the same (docs/build.py: RTOL).
ANOTHER_CPU = {"04_pipeline": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}}

@pytest.fixture(scope="module")
def warm():
    """The zygote each notebook's kernel is forked from (docs/warm_kernel.py: torch imported once, not per notebook);
    None (fresh kernels) when it may not serve (torch's import printed something or left a thread)."""
    with warm_kernel.WarmKernels(docs_build.kernel_env()) as w:
        if not w.ready: print(f"fresh kernels: {w.why}", file=sys.stderr)
        yield w if w.ready else None

@pytest.mark.slow                  # every notebook, each in a new kernel: about 10 minutes
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb, warm):
    """The notebook runs clean, and its committed outputs are what it makes now (text with its numbers as a reader
    reads them, kinds of images, no stderr); ANOTHER_CPU's notebooks show their last digits differ, yet match."""
    from nbclient.exceptions import CellExecutionError
    how = {"env": ANOTHER_CPU[nb.stem]} if nb.stem in ANOTHER_CPU else {"warm": warm}   # torch loaded on that path
    try: fresh = docs_build.execute(nb, timeout=1200, **how)
    except CellExecutionError as e: pytest.fail(f"notebook {nb.name} failed:\n{str(e)[-6000:]}")
    committed = docs_build.read_nb(nb)
    bad = docs_build.compare(nb.stem, committed, fresh)
    assert not bad, "\n".join(bad)
    if nb.stem in ANOTHER_CPU:          # the other path is real: printed digits differ, which an exact check fails
        texts = [(a[1], b[1]) for a, b in zip(docs_build.output_summary(committed), docs_build.output_summary(fresh))]
        assert any(a != b for a, b in texts), f"{nb.stem} printed the same digits on another CPU path"

PROBE = ["""import os, sys, warnings, numpy, torch
from ipykernel.kernelapp import IPKernelApp
print("forked", os.getppid() != int(os.environ["JPY_PARENT_PID"]))""",
"""print(os.path.basename(sys.argv[0]), os.getsid(0) == os.getpid(), os.getcwd(), sys.path)
app = IPKernelApp.instance()
print(app.parent_handle == int(os.environ["JPY_PARENT_PID"]), type(app).__module__)
print(sorted((k, v) for k, v in os.environ.items() if not k.startswith("JPY_")))""",
"""print("earlier", globals().get("probe_name"), getattr(torch, "_probe_name", None),
      getattr(IPKernelApp, "_probe_name", None))
probe_name = torch._probe_name = IPKernelApp._probe_name = "set"
print("now", probe_name, torch._probe_name, IPKernelApp._probe_name)""",
"print(sorted({repr(f) for f in warnings.filters}))",
"print(numpy.random.rand())"]

def test_a_kernel_forked_from_the_zygote_starts_as_a_fresh_one(tmp_path, warm):
    """A notebook sees at its start what it sees in a fresh kernel: argv, path, folder, session, parent's handle,
    environment, no name an earlier kernel set (globals, torch's or ipykernel's), no warning filter a fresh kernel
    lacks, numpy's random state its own; controls: the names show in the kernel that set them, and a kernel asked
    for with another environment is started fresh (its parent is the client, not the zygote)."""
    import nbformat
    assert warm is not None, "the zygote may not serve (docs/warm_kernel.py): fresh kernels only"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in PROBE])
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nb, tmp_path / "probe.ipynb")
    def run(**how):
        out = docs_build.execute(tmp_path / "probe.ipynb", **how)
        return ["".join(o["text"] for o in c.outputs if o.get("name") == "stdout") for c in out.cells]
    a, b, fresh = run(warm=warm), run(warm=warm), run()
    assert a[0] == b[0] == "forked True\n" and fresh[0] == "forked False\n"
    assert a[1] == b[1] == fresh[1] and a[1].startswith(f"ipykernel_launcher.py True {tmp_path} [")
    assert "\nTrue ipykernel.kernelapp\n" in a[1]
    assert a[2] == b[2] == fresh[2] == "earlier None None None\nnow set set set\n"      # the control: "now"
    assert set(eval(a[3])) <= set(eval(fresh[3])) and a[3] == b[3]
    assert len({a[4], b[4], fresh[4]}) == 3                              # numpy's global state not shared
    other = run(warm=warm, env={"MKL_CBWR": "COMPATIBLE"})               # control: MKL reads it when torch loads
    assert other[0] == "forked False\n" and "('MKL_CBWR', 'COMPATIBLE')" in other[1]

def test_a_zygote_with_a_thread_a_fork_would_drop_refuses_to_serve():
    """A fork copies only the thread that forks: a zygote whose torch import started a BLAS pool (OpenBLAS without
    OMP_NUM_THREADS=1 on two or more cores) serves no kernel; the suite's own environment leaves it one thread."""
    assert os.cpu_count() >= 2, "OpenBLAS starts no pool on one core: this control needs two"
    assert warm_kernel._unfit("", 1) is None and "threads" in warm_kernel._unfit("", 2)
    env = {k: v for k, v in docs_build.kernel_env().items() if k != "OMP_NUM_THREADS"}
    env["OPENBLAS_NUM_THREADS"] = "2"
    with warm_kernel.WarmKernels(env) as pooled:
        assert not pooled.ready and "2 threads after torch's import" in pooled.why, pooled.why

def _last_digit_moved(text: str) -> str:
    "Each printed decimal of `text` one unit larger in its last digit (as another CPU's rounding may print it)."
    def bump(m):
        s = m.group(1)
        mant, _, exp = s.lower().partition("e")
        places = len(mant.split(".")[1]) if "." in mant else 0
        moved = f"{float(mant) + 10 ** -places * (1 if float(mant) >= 0 else -1):.{places}f}"
        return moved + (s[len(mant):] if exp else "")
    return docs_build.NUMBER.sub(bump, text)

def test_numbers_compare_as_a_reader_reads_them():
    """04_pipeline's committed outputs with every printed decimal moved in its last digit still match (and the line
    another CPU printed: gnorm 2.119398 for 2.119399); controls: a digit that matters, a step, a word differ."""
    import nbformat
    committed = docs_build.read_nb(ROOT / "nbs" / "04_pipeline.ipynb")
    other = nbformat.reads(nbformat.writes(committed), as_version=4)
    moved = 0
    for c in other.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            if o.get("output_type") == "stream":
                moved += len(docs_build.NUMBER.findall(docs_build._text(o)))
                o["text"] = _last_digit_moved(docs_build._text(o))
    assert moved >= 12 and docs_build.compare("04_pipeline", committed, other) == []
    line = "step 1: pipeline loss 7.029223 gnorm 2.119399 | GPT loss 7.029224 gnorm 2.119399\n"
    assert docs_build.first_difference(line, line.replace("gnorm 2.119399", "gnorm 2.119398")) is None
    assert docs_build.first_difference("losses [7.1056, 7.0299]", "losses [7.1056, 7.0307]") is None   # bf16 steps
    assert docs_build.first_difference("largest 5.96e-08 | slope -0.0000", "largest 1.19e-07 | slope +0.0000") is None
    assert docs_build.first_difference("   -0.0  0.5\n", "    0.0  0.5\n") is None        # a table's padding
    # the controls: what a reader would see as another result
    assert docs_build.first_difference(line, line.replace("gnorm 2.119399", "gnorm 2.129399", 1)) == 37
    assert docs_build.first_difference(line, line.replace("loss 7.029223", "loss 7.039223")) is not None
    assert docs_build.first_difference(line, line.replace("step 1", "step 2")) == 5           # integers exactly
    assert docs_build.first_difference(line, line.replace("GPT", "GTP")) is not None
    assert docs_build.first_difference("accuracy 0.5", "accuracy 0.6") is not None
    assert docs_build.first_difference("megatron-core 0.19.2", "megatron-core 0.19.3") is not None    # a version
    assert docs_build.first_difference("lr 6e-05", "lr 6e-04") is not None
    assert docs_build.first_difference("a 1.5", "a 1.5 b") is not None
    stale = nbformat.reads(nbformat.writes(committed), as_version=4)
    cell = next(c for c in stale.cells if c.cell_type == "code" and "gnorm 2.119399" in "".join(
        docs_build._text(o) for o in c.get("outputs", [])))
    out = next(o for o in cell.outputs if "gnorm 2.119399" in docs_build._text(o))
    out["text"] = docs_build._text(out).replace("gnorm 2.119399", "gnorm 2.129399", 1)
    bad = docs_build.compare("04_pipeline", committed, stale)
    assert len(bad) == 1 and "committed text differs" in bad[0] and "2.129399" in bad[0], bad

@pytest.mark.parametrize("stem", sorted(docs_build.OUTSIDE_SUITE))
def test_outputs_made_outside_the_suite_are_current(stem):
    "A notebook the suite does not execute carries outputs, made from the code it has now (its fingerprint)."
    nb = docs_build.read_nb(ROOT / "nbs" / f"{stem}.ipynb")
    assert docs_build.has_outputs(nb), f"nbs/{stem}.ipynb has no outputs: run {docs_build.refresh_command(stem)}"
    assert not docs_build.noise(nb), docs_build.noise(nb)
    recorded = docs_build.read_record().get(stem, {}).get("fingerprint")
    assert recorded == docs_build.fingerprint(stem), \
        f"nbs/{stem}.ipynb's outputs were made from other code (its cells or the library modules it uses): " \
        f"run {docs_build.refresh_command(stem)}"

def test_fingerprint_follows_the_code_that_made_the_outputs(tmp_path):
    """The fingerprint changes with a notebook's cell and with a module it uses, not with a module it does not use nor
    with the outputs' digits (it hashes source, no computed number: the same on every CPU)."""
    shutil.copytree(ROOT / "mtnlg", tmp_path / "mtnlg", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "nbs").mkdir()
    stem = "12_demo_report"
    shutil.copy(ROOT / "nbs" / f"{stem}.ipynb", tmp_path / "nbs")
    before = docs_build.fingerprint(stem, tmp_path)
    assert before == docs_build.fingerprint(stem)
    nb = json.loads((tmp_path / "nbs" / f"{stem}.ipynb").read_text())      # outputs made on another CPU: the same
    out = next(o for c in nb["cells"] for o in c.get("outputs", []) if "text/plain" in o.get("data", {}))
    out["data"]["text/plain"] = [re.sub(r"\d(?=\D*$)", "0", "".join(out["data"]["text/plain"]))]
    (tmp_path / "nbs" / f"{stem}.ipynb").write_text(json.dumps(nb))
    assert docs_build.fingerprint(stem, tmp_path) == before
    used = {f.name for f in docs_build.library_closure(["demo"], tmp_path)}
    assert {"demo.py", "train.py", "eval.py", "corpus.py", "results.py"} <= used and "cli.py" not in used, used
    (tmp_path / "mtnlg" / "cli.py").write_text("# a module the report does not use\n")
    assert docs_build.fingerprint(stem, tmp_path) == before
    results = tmp_path / "mtnlg" / "results.py"
    results.write_text(results.read_text() + "\n# changed\n")                  # a module it uses: the control
    assert docs_build.fingerprint(stem, tmp_path) != before
    shutil.copy(ROOT / "mtnlg" / "results.py", results)
    nb = json.loads((tmp_path / "nbs" / f"{stem}.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["source"] = "".join(cell["source"]) + "\n# changed"
    (tmp_path / "nbs" / f"{stem}.ipynb").write_text(json.dumps(nb))
    assert docs_build.fingerprint(stem, tmp_path) != before

def test_readme_figures_are_what_the_notebooks_show(tmp_path, monkeypatch):
    "docs/images' figures are byte for byte the images of the committed notebooks (README_FIGURES); control: swapped."
    assert docs_build.figure_problems() == []
    figures = tmp_path / "images"
    shutil.copytree(docs_build.FIGURES, figures)
    (figures / "training.png").write_bytes((figures / "eval.png").read_bytes())
    monkeypatch.setattr(docs_build, "FIGURES", figures)
    bad = docs_build.figure_problems()
    assert len(bad) == 1 and "training.png is not the image" in bad[0], bad

def test_output_check_catches_stale_missing_and_noisy_outputs(tmp_path):
    "compare() names notebook, cell and command for missing, changed and noisy outputs; `eval: false` is not run."
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)"),
                                         nbformat.v4.new_code_cell("#| eval: false\n1/0"),
                                         nbformat.v4.new_code_cell("import sys; print('done', file=sys.stderr)")])
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nb, tmp_path / "zz.ipynb")
    assert "committed without outputs; run `make outputs STEMS=zz`" in docs_build.compare("zz", nb, nb)[0]
    fresh = docs_build.execute(tmp_path / "zz.ipynb")
    assert fresh.cells[0].outputs[0]["text"] == "42\n" and not fresh.cells[1].outputs    # eval: false is not run
    bad = docs_build.compare("zz", fresh, fresh)
    assert len(bad) == 1, bad
    assert "code cell 3 (`import sys; print('done', file=sys.stderr)`) writes to stderr" in bad[0], bad
    fresh.cells[2].outputs = []
    assert docs_build.compare("zz", fresh, fresh) == []
    stale = nbformat.reads(nbformat.writes(fresh), as_version=4)
    stale.cells[0].outputs[0]["text"] = "41\n"
    bad = docs_build.compare("zz", stale, fresh)
    assert len(bad) == 1 and "code cell 1 (`print(6 * 7)`): committed text differs" in bad[0], bad
    assert "run `make outputs STEMS=zz`" in bad[0]
