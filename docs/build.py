"""Build the documentation site with mkdocs (Python only, no Quarto): the README as home page, one page per notebook
with its executed outputs and plots, an API reference from the docstrings and inline parameter docs, and search.

    python docs/build.py                      # make docs: execute what needs it (cached), build into _docs/
    python docs/build.py --execute none       # only committed outputs (fast)
    python docs/build.py --outputs            # make outputs: re-execute the notebooks of docs/outputs.txt in place
    python docs/build.py --check-outputs      # fail if a committed output is not what the notebook makes now
"""
from __future__ import annotations
import argparse, base64, hashlib, importlib, inspect, json, os, re, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
OUTPUTS_LIST = ROOT / "docs" / "outputs.txt"
CACHE = ROOT / ".build" / "docs" / "executed"
# Notebooks that are not executed for the docs, and where their executed record comes from instead.
RECORDED = {"12_demo_report": "runs/demo/**/12_demo_report*.ipynb"}   # executed by `make demo` (needs a demo run)
SKIP_FLAGS = ("notest", "slow")      # as nbdev's test runner (settings.ini tst_flags): not executed
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")

def log(*a): print("[docs]", *a, file=sys.stderr, flush=True)

def notebooks() -> list[Path]:
    "The documented notebooks: every nbs/*.ipynb but index.ipynb (that one is the README, the home page)."
    return sorted(p for p in NBS.glob("*.ipynb") if p.stem != "index")

def read_nb(path):
    import nbformat
    return nbformat.read(path, as_version=4)

def directives(cell) -> dict:
    "nbdev's `#| name value` lines at the top of a cell, as {name: value}."
    out = {}
    for line in cell.source.splitlines():
        m = re.match(r"#\|\s*([\w-]+):?\s*(.*)$", line.strip())
        if not m: break
        out[m.group(1)] = m.group(2).strip()
    return out

def skipped(cell) -> bool:
    "True for a code cell that nbdev's test runner would not execute."
    d = directives(cell)
    return d.get("eval", "").lower() == "false" or any(f in d for f in SKIP_FLAGS)

def has_outputs(nb) -> bool: return any(c.get("outputs") for c in nb.cells if c.cell_type == "code")

def committed_outputs() -> list[str]:
    "Notebook stems listed in docs/outputs.txt: committed with their outputs (cheap, deterministic)."
    return [l.split("#")[0].strip().removesuffix(".ipynb") for l in OUTPUTS_LIST.read_text().splitlines()
            if l.split("#")[0].strip()]

def fingerprint(path: Path) -> str:
    "Hash of the notebook's code and the library it runs (a cached execution is valid while this is unchanged)."
    h = hashlib.sha256()
    nb = read_nb(path)
    for c in nb.cells:
        if c.cell_type == "code": h.update(c.source.encode() + b"\0")
    for p in sorted((ROOT / "mtnlg").rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts: h.update(p.relative_to(ROOT).as_posix().encode() + p.read_bytes())
    h.update((ROOT / "settings.ini").read_bytes())
    return h.hexdigest()[:16]

def execute(path: Path, timeout: int = 1800, kernel: str = "python3"):
    "The notebook at `path` executed in a fresh kernel in nbs/ (cells nbdev's test runner skips stay unexecuted)."
    import nbformat
    from nbclient import NotebookClient
    nb = read_nb(path)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
            if skipped(c): c.metadata.setdefault("tags", []).append("skip-execution")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    t = time.time()
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, resources={"metadata": {"path": str(path.parent)}})
    client.km = client.create_kernel_manager()
    client.km.extra_env = env
    client.execute()
    for c in nb.cells:
        tags = c.metadata.get("tags", [])
        if "skip-execution" in tags: tags.remove("skip-execution")
        if "tags" in c.metadata and not tags: del c.metadata["tags"]
    log(f"executed {path.name} in {time.time() - t:.0f}s")
    return nb

def executed(path: Path, refresh=False):
    "The executed notebook, from the cache when its fingerprint is unchanged."
    CACHE.mkdir(parents=True, exist_ok=True)
    f = CACHE / f"{path.stem}.{fingerprint(path)}.ipynb"
    if f.exists() and not refresh: return read_nb(f)
    import nbformat
    nb = execute(path)
    for old in CACHE.glob(f"{path.stem}.*.ipynb"): old.unlink()
    tmp = f.with_suffix(".tmp"); nbformat.write(nb, tmp); os.replace(tmp, f)
    return nb

def recorded(stem: str):
    "The newest executed record of a notebook that the docs do not execute, or None."
    found = sorted(ROOT.glob(RECORDED[stem]), key=lambda p: p.stat().st_mtime)
    return read_nb(found[-1]) if found else None

def source_for(path: Path, execute_mode: str):
    "(notebook, how): committed outputs, a recorded run, an execution, or the plain notebook."
    stem, nb = path.stem, read_nb(path)
    if stem in committed_outputs() and has_outputs(nb): return nb, "committed outputs"
    if stem in RECORDED:
        rec = recorded(stem)
        return (rec, "recorded run") if rec is not None else (nb, "not executed: no recorded run yet (make demo)")
    if execute_mode == "none" or (execute_mode not in ("all", "missing") and stem not in execute_mode.split(",")):
        return nb, "not executed"
    try: return executed(path), "executed"
    except Exception as e:                        # the site is still built; `make docs` fails at the end
        log(f"{path.name}: execution failed: {type(e).__name__}: {str(e)[-1500:]}")
        return nb, f"execution failed ({type(e).__name__}; see the build log)"

def for_page(nb, note: str):
    "The notebook as a page: no hidden or directive-only cells, no `#|` lines, a note on where outputs come from."
    import nbformat
    cells = []
    for c in nb.cells:
        d = directives(c) if c.cell_type == "code" else {}
        if "hide" in d or "default_exp" in d: continue
        if c.cell_type == "code":
            c.source = "\n".join(l for l in c.source.splitlines() if not l.strip().startswith("#|")).strip("\n")
            if not c.source: continue
        else:   # mkdocs-jupyter's table of contents drops `code` from heading anchors: keep headings plain text
            c.source = re.sub(r"(?m)^(#{1,6} .*)$", lambda m: m.group(1).replace("`", ""), c.source)
        cells.append(c)
    if note != "executed":
        cells.insert(1 if cells and cells[0].cell_type == "markdown" else 0,
                     nbformat.v4.new_markdown_cell(f"*Outputs on this page: {note}.*"))
    nb.cells = cells
    return nb

# --- API reference --------------------------------------------------------------------------------------------
def modules() -> list[str]:
    return [f"mtnlg.{p.stem}" for p in sorted((ROOT / "mtnlg").glob("*.py")) if not p.stem.startswith("_")]

def api_page(modname: str) -> str:
    "Markdown for one module: its docstring, then nbdev's `show_doc` of every public function and class."
    from nbdev.showdoc import show_doc
    importlib.import_module("mtnlg.topology")      # quiets megatron-core's import notices before any module loads it
    m = importlib.import_module(modname)
    out = [f"# {modname}", "", inspect.getdoc(m) or "", ""]
    for name in getattr(m, "__all__", []):
        obj = getattr(m, name, None)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)): continue
        md = show_doc(obj, name=name)._repr_markdown_()
        md = "\n".join(l for l in md.splitlines() if not l.startswith("[source]("))
        out.append(md.replace("\n---\n", "\n", 1).strip() + "\n")
    return "\n".join(out)

# --- the site -------------------------------------------------------------------------------------------------
def mathjax_dir() -> Path:
    """MathJax 3's browser build (es5/: tex-mml-chtml.js, its fonts and components) from the django-static-mathjax
    wheel (settings.ini's docs requirements, pinned in environments/): a local copy, so formulas render offline."""
    import importlib.util
    spec = importlib.util.find_spec("mathjax")
    d = Path(spec.origin).parent / "static" / "mathjax" / "es5" if spec and spec.origin else None
    if d is None or not (d / "tex-mml-chtml.js").exists():
        raise SystemExit("docs: MathJax is missing (the django-static-mathjax package of the pinned environment): "
                         "run `make env`, or pip install django-static-mathjax==3.2.2.1")
    return d

def stage(src: Path, execute_mode: str) -> dict:
    "Write the mkdocs sources into `src`; returns the nav."
    import nbformat
    if src.exists(): shutil.rmtree(src)
    (src / "nbs").mkdir(parents=True); (src / "api").mkdir()
    readme = (ROOT / "README.md").read_text()
    # the README's link to the notebooks' folder (GitHub lists it) opens the first notebook's page on the site
    (src / "index.md").write_text(readme.replace("](nbs/)", f"](nbs/{notebooks()[0].name})"))
    (src / "benchmarks").mkdir(); shutil.copy(ROOT / "benchmarks" / "RESULTS.md", src / "benchmarks" / "RESULTS.md")
    if (ROOT / "docs" / "images").exists(): shutil.copytree(ROOT / "docs" / "images", src / "docs" / "images")
    shutil.copytree(ROOT / "docs" / "assets", src / "assets")          # the site's CSS and MathJax configuration
    shutil.copytree(mathjax_dir(), src / "assets" / "mathjax")         # MathJax itself: the site works offline
    pages, notes = [], {}
    for p in notebooks():
        nb, how = source_for(p, execute_mode)
        notes[p.stem] = how
        nbformat.write(for_page(nb, how), src / "nbs" / p.name)
        title = next((c.source.splitlines()[0].lstrip("# ").strip() for c in nb.cells
                      if c.cell_type == "markdown" and c.source.startswith("# ")), p.stem)
        pages.append({f"{p.stem[:2]} {title}" if p.stem[:2].isdigit() else title: f"nbs/{p.name}"})
        log(f"{p.name}: {how}")
    api = []
    for mod in modules():
        (src / "api" / f"{mod}.md").write_text(api_page(mod)); api.append({mod: f"api/{mod}.md"})
    return {"nav": [{"Home": "index.md"}, {"Notebooks": pages}, {"API reference": api},
                    {"Results": "benchmarks/RESULTS.md"}], "notes": notes}

def build(out: Path, execute_mode: str = "missing", work: Path | None = None) -> dict:
    "Stage the sources and run mkdocs into `out`; returns {'out', 'notes'}."
    work = work or ROOT / ".build" / "docs"
    src = work / "src"
    staged = stage(src, execute_mode)
    cfg = work / "mkdocs.yml"
    base = (ROOT / "mkdocs.yml").read_text()
    nav = json.dumps(staged["nav"])        # JSON is YAML
    cfg.write_text(f"{base}\ndocs_dir: {json.dumps(str(src))}\nsite_dir: {json.dumps(str(out))}\nnav: {nav}\n")
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--clean", "-q", "-f", str(cfg)],
                       capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    if p.returncode: raise SystemExit(f"mkdocs build failed:\n{p.stdout}{p.stderr}")
    for line in (p.stdout + p.stderr).splitlines():
        if line.strip(): log(line)
    (out / "docs-build.json").write_text(json.dumps({"notes": staged["notes"]}, indent=1))
    log(f"site in {out} (open {out / 'index.html'})")
    return {"out": out, "notes": staged["notes"]}

# --- committed outputs ----------------------------------------------------------------------------------------
def _norm(text: str) -> str:
    "Output text without what legitimately varies run to run (addresses, timings, temporary paths)."
    text = text.replace(str(ROOT), "<repo>")
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    text = re.sub(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\]", "[time]", text)      # logging's timestamps
    text = re.sub(r"/tmp/[^\s'\"]+", "/tmp/?", text)
    text = re.sub(r"(['\"]\w*(seconds|_s|_per_s|tok_s)['\"]:\s*)[-\d.e+]+", r"\1?", text)   # timing fields of dicts
    return re.sub(r"\d+(\.\d+)?\s*(s|ms|sec|seconds)\b", "? s", text)

def output_summary(nb) -> list:
    "Per code cell: its stdout and results as text (normalised; stderr is not compared) and its kinds of images."
    out = []
    for c in nb.cells:
        if c.cell_type != "code": continue
        texts, images = [], []
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                if o.get("name") == "stdout": texts.append(o.get("text", ""))
            elif o.get("output_type") == "error": texts.append(f"ERROR {o.get('ename')}: {o.get('evalue')}")
            else:
                data = o.get("data", {})
                images += [k for k in data if k in IMAGE_TYPES]
                if "text/plain" in data and not any(k in data for k in IMAGE_TYPES):
                    texts.append(data["text/plain"] if isinstance(data["text/plain"], str) else "".join(data["text/plain"]))
        out.append((c.source, _norm("".join(texts)), sorted(images)))
    return out

def write_outputs(stems: list[str]):
    "Execute the listed notebooks and write them back into nbs/ with their outputs (stderr left out), nbdev-clean."
    import nbformat
    for stem in stems:
        path = NBS / f"{stem}.ipynb"
        nb = execute(path)
        for c in nb.cells:   # log lines and warnings carry times and local paths: not committed
            if c.cell_type == "code": c.outputs = [o for o in c.outputs if o.get("name") != "stderr"]
        tmp = path.with_suffix(".tmp"); nbformat.write(nb, tmp); os.replace(tmp, path)
        subprocess.run([str(Path(sys.executable).parent / "nbdev_clean"), "--fname", str(path)], cwd=ROOT, check=True)
        log(f"{path.name}: outputs written")

def check_outputs(stems: list[str]) -> list[str]:
    "Problems: a listed notebook without outputs, or whose outputs differ from a fresh execution."
    bad = []
    for stem in stems:
        path = NBS / f"{stem}.ipynb"
        committed = read_nb(path)
        if not has_outputs(committed): bad.append(f"{path.name}: listed in docs/outputs.txt but has no outputs"); continue
        now = output_summary(execute(path))
        for i, (a, b) in enumerate(zip(output_summary(committed), now)):
            if a != b:
                what = "code" if a[0] != b[0] else "images" if a[2] != b[2] else "text"
                bad.append(f"{path.name}: code cell {i + 1}: committed {what} differs from a fresh run:\n"
                           f"  committed: {str(a[1] if what == 'text' else a[2] if what == 'images' else a[0])[:300]!r}\n"
                           f"  now:       {str(b[1] if what == 'text' else b[2] if what == 'images' else b[0])[:300]!r}")
                break
    return bad

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--out", default=str(ROOT / "_docs"), help="site folder (default: _docs, ignored by git)")
    ap.add_argument("--execute", default="missing", metavar="MODE",
                    help="'missing' (default: every notebook without committed outputs, cached), 'none', or stems a,b")
    ap.add_argument("--outputs", nargs="*", metavar="STEM", help="write outputs into the notebooks of docs/outputs.txt "
                                                                  "(or the STEMs given)")
    ap.add_argument("--check-outputs", nargs="*", metavar="STEM", help="check the committed outputs are current")
    a = ap.parse_args(argv)
    for stem in (a.outputs or []) + (a.check_outputs or []):
        if not (NBS / f"{stem}.ipynb").exists(): ap.error(f"no notebook nbs/{stem}.ipynb")
    if a.outputs is not None: write_outputs(a.outputs or committed_outputs()); return 0
    if a.check_outputs is not None:
        bad = check_outputs(a.check_outputs or committed_outputs())
        if bad: print("\n".join(bad) + "\nrun `make outputs` to refresh them", file=sys.stderr); return 1
        log("committed outputs are current"); return 0
    notes = build(Path(a.out).resolve(), a.execute)["notes"]
    failed = [k for k, v in notes.items() if v.startswith("execution failed")]
    if failed: print(f"notebooks that failed to execute: {', '.join(failed)}", file=sys.stderr); return 1
    return 0

if __name__ == "__main__": sys.exit(main())
