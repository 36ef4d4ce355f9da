"""The package tooling catches what it must: a broken notebook cell, a library edited behind the notebooks,
a dirty notebook; and the exported library imports on its own."""
import json, os, re, shutil, subprocess, sys
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

def _parameter_names(nb_path):
    "Names the `parameters` cell of a notebook assigns, or None when it has none."
    import ast
    nb = nbformat.read(nb_path, as_version=4)
    cell = next((c for c in nb.cells if "parameters" in c.metadata.get("tags", [])), None)
    if cell is None: return None
    return [t.target.id if isinstance(t, ast.AnnAssign) else t.targets[0].id for t in ast.parse(cell.source).body]

def test_papermill_reads_every_parameter_of_the_training_job():
    "`papermill --help-notebook` lists every name the parameters cell assigns, and parses each line."
    names = _parameter_names(ROOT / "nbs/11_train_job.ipynb")
    p = subprocess.run([str(Path(sys.executable).parent / "papermill"), "--help-notebook", "nbs/11_train_job.ipynb"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Unable to parse" not in out, out
    listed = re.findall(r"^  (\w+): ", out, re.M)
    assert listed == names and len(names) >= 7, (listed, names)

def test_papermill_parses_every_parameters_cell(caplog):
    "Every notebook with a parameters cell: papermill's inspection finds each parameter, with no unparsed line."
    import papermill
    seen = 0
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        names = _parameter_names(nb)
        if names is None: continue
        caplog.clear()
        found = list(papermill.inspect_notebook(str(nb)))
        assert "Unable to parse" not in caplog.text, f"{nb.name}: {caplog.text}"
        assert found == names, (nb.name, found, names)
        seen += 1
    assert seen >= 2

def test_malformed_config_file_is_one_line_naming_file_line_and_column(tmp_path):
    "A broken YAML or JSON `--config` ends in one line with file:line:column and the fix, not a parser traceback."
    from mtnlg.config import ConfigError, read_config_file
    (tmp_path / "bad.yaml").write_text("model:\n  num_layers: 4\n   hidden_size: 8\n")
    (tmp_path / "bad.json").write_text('{"model": {"num_layers": 4,}}')
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "ok.yaml").write_text("model:\n  num_layers: 2\n")
    assert read_config_file(tmp_path / "ok.yaml") == {"model": {"num_layers": 2}}
    exe = Path(sys.executable).parent / "mtnlg"
    for name, where in [("bad.yaml", "bad.yaml:3:15: malformed YAML"), ("bad.json", "bad.json:1:28: malformed JSON"),
                        ("list.yaml", "list.yaml holds a list, not settings")]:
        try: read_config_file(tmp_path / name); raise AssertionError(f"{name} was accepted")
        except ConfigError as e: assert where in str(e) and "\n" not in str(e), e
        p = subprocess.run([str(exe), "plan", "--config", name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and where in lines[0] and "Traceback" not in p.stderr, p.stderr

NOTICE = "Transformer Engine and Apex are not installed"

def test_quiet_by_default_verbose_shows_megatron_notices(tmp_path):
    """What `mtnlg` does first: hide megatron-core's import notices, here and in the processes it starts, unless
    --verbose; other warnings stay. (Real megatron-core imports: 02_topology and the fresh-venv test.)"""
    from mtnlg.cli import NOTICES
    from mtnlg.topology import MEGATRON_NOTICES
    assert NOTICES == MEGATRON_NOTICES
    env = {k: v for k, v in os.environ.items() if k not in ("MTNLG_VERBOSE", "PYTHONWARNINGS")}
    notice = f"warnings.warn('{NOTICE}. Falling back to Torch optimizers.')"
    code = ("import subprocess, sys, warnings; from mtnlg.cli import quiet_notices; quiet_notices('--verbose' in sys.argv); "
            f"{notice}; warnings.warn('a real warning'); "
            f"subprocess.run([sys.executable, '-c', \"import warnings; {notice}\"])")   # a child, as a rank
    quiet = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    loud = subprocess.run([sys.executable, "-c", code, "--verbose"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=300)
    assert NOTICE not in quiet.stderr and "a real warning" in quiet.stderr, quiet.stderr
    assert loud.stderr.count(NOTICE) == 2 and "a real warning" in loud.stderr, loud.stderr    # here and in the child

def test_nbdev_clean_keeps_committed_outputs(tmp_path):
    "Notebooks committed with outputs keep their tables and plots through nbdev_clean (clear_all=False); counts go."
    t = _copy_tree(tmp_path)
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    cell = nbformat.v4.new_code_cell("plot()", execution_count=3, outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="42\n"),
        nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}),
        nbformat.v4.new_output("execute_result", data={"text/plain": "7"}, execution_count=3)])
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), t / "nbs/zz_out.ipynb")
    subprocess.run([str(Path(sys.executable).parent / "nbdev_clean"), "--fname", "nbs/zz_out.ipynb"], cwd=t, check=True)
    c = json.loads((t / "nbs/zz_out.ipynb").read_text())["cells"][0]
    assert c["execution_count"] is None and [o["output_type"] for o in c["outputs"]] == ["stream", "display_data", "execute_result"]
    assert c["outputs"][1]["data"]["image/png"].strip() == png


def test_a_parallel_run_without_the_disk_it_needs_stops_before_any_test(tmp_path):
    "A `make test` run whose temp disk lacks the suite's room stops at once, naming it (CI once ran out at the end)."
    args = [sys.executable, "-m", "pytest", "tests/test_plan.py", "-k", "paper_numbers", "-n", "1", "-q",
            "-p", "no:cacheprovider"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["TMPDIR"] = str(tmp_path)
    short = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(env, MTNLG_SUITE_DISK_GB="1e9"))
    assert short.returncode == 4, short.stdout + short.stderr
    assert f"{tmp_path}, which has" in short.stderr and "point TMPDIR at a disk with room" in short.stderr
    assert "1 passed" not in short.stdout
    room = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(env, MTNLG_SUITE_DISK_GB="0"))
    assert room.returncode == 0 and "1 passed" in room.stdout, room.stdout + room.stderr     # the control
    assert not list(tmp_path.glob("mtnlg-pytest-*")), "a refused or passing session left its temp root"


def _markdown_not_in(readme: str) -> list:
    "The first words of each markdown cell of nbs/index.ipynb that `readme` does not hold word for word."
    nb = nbformat.read(ROOT / "nbs" / "index.ipynb", as_version=4)
    return [c.source[:80] for c in nb.cells if c.cell_type == "markdown" and c.source.strip() not in readme]


def test_readme_is_the_index_notebook_rendered():
    "README.md is nbs/index.ipynb rendered by `make readme`: an edit made to README.md alone is found."
    readme = (ROOT / "README.md").read_text()
    assert not _markdown_not_in(readme), f"README.md differs from nbs/index.ipynb: edit the notebook, then run " \
                                         f"`make readme` ({_markdown_not_in(readme)})"
    assert _markdown_not_in(readme.replace("make test", "make tests", 1))           # the control: one word edited

def story_table_problems(readme: str) -> list:
    "How the README's story table differs from nbs/: every notebook, in the folder's order, each linked to its file."
    rows = re.findall(r"(?m)^\| \[`(\w+)`\]\((nbs/\w+\.ipynb)\) \|", readme)
    stems = sorted(p.stem for p in (ROOT / "nbs").glob("*.ipynb") if p.stem != "index")
    out = [f"row {s}: links {link}" for s, link in rows if link != f"nbs/{s}.ipynb"]
    if [s for s, _ in rows] != stems:
        out.append(f"rows {[s for s, _ in rows]} are not nbs/ in its order {stems}")
    return out

def test_readme_story_table_lists_every_notebook_in_order():
    "The story table has one linked row per notebook, in nbs/'s order; controls: a row moved, a row left out."
    readme = (ROOT / "README.md").read_text()
    assert story_table_problems(readme) == []
    rows = re.findall(r"(?m)^\| \[`\w+`\].*\n", readme)
    assert story_table_problems(readme.replace(rows[1], "").replace(rows[3], rows[3] + rows[1]))      # moved
    assert story_table_problems(readme.replace(rows[-2], ""))                                         # left out
    assert "https://arxiv.org/abs/2201.11990" in readme and "](benchmarks/RESULTS.md)" in readme and "](nbs/)" in readme
