"""The package tooling catches what it must: a broken notebook cell, a library edited behind the notebooks,
a dirty notebook; and the exported library imports on its own."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import nbformat
from conftest import ROOT, run_notebook_tests

def _copy_tree(tmp_path):
    "A copy of what the sync/clean checks read, with the Makefile, using the real .venv."
    for name in ("nbs", "mtnlg", "settings.ini", "Makefile"):
        src = ROOT / name
        (shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
         if src.is_dir() else shutil.copy(src, tmp_path / name))
    (tmp_path / "environments").mkdir(); shutil.copy(ROOT / "environments/cpu.txt", tmp_path / "environments")
    shutil.copy(ROOT / "setup.py", tmp_path)
    return tmp_path

def _make(tmp_path, target):
    venv = Path(sys.executable).parent.parent
    # the stamp must be newer than the copied inputs so make does not reinstall
    env = dict(os.environ, VENV=str(venv))
    p = subprocess.run(["make", "-o", str(venv / ".mtnlg-installed"), f"VENV={venv}", target], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stdout + p.stderr

def test_sync_check_passes_on_repo_and_fails_on_hand_edit(tmp_path):
    t = _copy_tree(tmp_path)
    code, out = _make(t, "check-sync")
    assert code == 0, out
    with open(t / "mtnlg/config.py", "a") as f: f.write("\nHAND_EDIT = 1\n")
    code, out = _make(t, "check-sync")
    assert code != 0 and "differs from what nbs/ exports" in out, out

def test_clean_check_fails_on_dirty_notebook(tmp_path):
    t = _copy_tree(tmp_path)
    code, out = _make(t, "check-clean")
    assert code == 0, out
    nb = nbformat.read(t / "nbs/00_config.ipynb", as_version=4)
    nb.cells[1].execution_count = 7
    nb.cells[1].metadata["collapsed"] = True
    nbformat.write(nb, t / "nbs/00_config.ipynb")
    code, out = _make(t, "check-clean")
    assert code != 0 and "not clean" in out, out

def test_parameters_tag_survives_nbdev_clean(tmp_path):
    t = _copy_tree(tmp_path)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("steps = 3", metadata={"tags": ["parameters"], "scrolled": True})])
    nbformat.write(nb, t / "nbs/zz_params.ipynb")
    subprocess.run([str(Path(sys.executable).parent / "nbdev_clean"), "--fname", "nbs/zz_params.ipynb"], cwd=t, check=True)
    meta = json.loads((t / "nbs/zz_params.ipynb").read_text())["cells"][0]["metadata"]
    assert meta == {"tags": ["parameters"]}

def _nb(tmp_path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata = {"kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}}
    p = tmp_path / "t.ipynb"; nbformat.write(nb, p); return p

def test_broken_notebook_cell_fails_the_notebook_runner(tmp_path):
    ok, out = run_notebook_tests(_nb(tmp_path, "x = 1", "assert x == 2, 'deliberately broken'"))
    assert not ok and "deliberately broken" in out

def test_notebook_runner_honours_eval_false(tmp_path):
    ok, out = run_notebook_tests(_nb(tmp_path, "x = 1", "#| eval: false\nraise RuntimeError('never run')", "assert x == 1"))
    assert ok, out

def test_library_imports_from_another_directory(tmp_path):
    p = subprocess.run([sys.executable, "-c", "import mtnlg, mtnlg.config, mtnlg.cli; print(mtnlg.__version__)"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip(), p.stderr

def test_console_script_version_and_unknown_option():
    exe = Path(sys.executable).parent / "mtnlg"
    p = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("mtnlg "), p.stderr
    p = subprocess.run([str(exe), "train", "--no-such-flag"], capture_output=True, text=True)
    assert p.returncode == 2 and "--no-such-flag" in p.stderr

def test_readme_shows_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci/run").read_text()
