"""Every notebook in nbs/ is committed with its outputs, and they are what it makes: each is executed once here, in a
fresh kernel as nbdev's test runner would (`#| eval: false` cells are not run), and compared cell by cell with what
is committed (docs/build.py: `make outputs` writes them). A notebook too slow for the suite carries the outputs
`make outputs` made and a fingerprint of what made them (docs/outputs.json), checked here."""
import json, shutil, sys
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import build as docs_build       # docs/build.py

NOTEBOOKS = [p for p in docs_build.notebooks() if p.stem not in docs_build.OUTSIDE_SUITE]

@pytest.mark.slow                  # every notebook, each in a fresh kernel: about 10 minutes
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb):
    "The notebook runs clean, and its committed outputs are what it makes now (text, kinds of images, no stderr)."
    from nbclient.exceptions import CellExecutionError
    try: fresh = docs_build.execute(nb, timeout=1200)
    except CellExecutionError as e: pytest.fail(f"notebook {nb.name} failed:\n{str(e)[-6000:]}")
    bad = docs_build.compare(nb.stem, docs_build.read_nb(nb), fresh)
    assert not bad, "\n".join(bad)

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
    "The fingerprint changes with a notebook's cell and with a module it uses, not with a module it does not use."
    shutil.copytree(ROOT / "mtnlg", tmp_path / "mtnlg", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "nbs").mkdir()
    stem = "12_demo_report"
    shutil.copy(ROOT / "nbs" / f"{stem}.ipynb", tmp_path / "nbs")
    before = docs_build.fingerprint(stem, tmp_path)
    assert before == docs_build.fingerprint(stem)
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
