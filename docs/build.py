"""Build the documentation site with mkdocs (Python only, no Quarto): the README as home page, one page per notebook
with its executed outputs and plots, an API reference from the docstrings and inline parameter docs, and search.

    python docs/build.py                      # make docs: the notebooks as committed, with their outputs
    python docs/build.py --execute 07_eval    # ... that notebook executed now (cached in .build/docs)
    python docs/build.py --outputs [STEM ...] # make outputs: execute every notebook (or those) and commit-ready
                                              # write it back with its outputs; the README's figures too
    python docs/build.py --check-outputs      # fail if a committed output is not what the notebook makes now
"""
from __future__ import annotations
import argparse, base64, hashlib, importlib, inspect, json, os, re, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
CACHE = ROOT / ".build" / "docs" / "executed"
SKIP_FLAGS = ("notest", "slow")      # as nbdev's test runner (settings.ini tst_flags): not executed
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

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
    "True for a code cell that nbdev's test runner would not execute (`#| eval: false`, a skip flag, nbdev_export())."
    d = directives(cell)
    return d.get("eval", "").lower() == "false" or any(f in d for f in SKIP_FLAGS) or "nbdev_export" + "(" in cell.source

def has_outputs(nb) -> bool: return any(c.get("outputs") for c in nb.cells if c.cell_type == "code")

def kernel_env(env: dict | None = None) -> dict:
    "The environment a notebook's kernel gets: ours without a launcher's variables, as nbdev's test runner's."
    out = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    out.update(IN_TEST="1", PYTHONHASHSEED="0", **(env or {}))     # as nbdev's test runner; hashing (set order) fixed
    # the Hugging Face libraries' bars in a notebook's own calls (save_pretrained, save_to_disk): no progress shown
    out.update(HF_HUB_DISABLE_PROGRESS_BARS="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")
    return out

def execute(path: Path, timeout: int = 1800, kernel: str = "python3", parameters: dict | None = None,
            env: dict | None = None, warm=None):
    """The notebook at `path` executed in a fresh kernel in nbs/, as nbdev's test runner would (cells it skips stay
    unexecuted, IN_TEST=1); `parameters` are set after its `parameters` cell (the cell's source is kept); `env`: more
    variables for the kernel; `warm`: a docs/warm_kernel.py WarmKernels to fork the kernel from (the suite's)."""
    from nbclient import NotebookClient
    nb = read_nb(path)
    kept = {}
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
            if skipped(c): c.metadata.setdefault("tags", []).append("skip-execution")
            if parameters and "parameters" in c.metadata.get("tags", []):
                kept[id(c)] = c.source
                c.source += "\n" + "".join(f"\n{k} = {v!r}" for k, v in parameters.items())
    env = kernel_env(env)
    t = time.time()
    how = {"kernel_name": warm.name, "kernel_manager_class": warm.kernel_manager_class} if warm else \
          {"kernel_name": kernel}
    client = NotebookClient(nb, timeout=timeout, resources={"metadata": {"path": str(path.parent)}}, **how)
    try: client.execute(env=env)                 # the kernel's whole environment
    finally:
        for c in nb.cells:
            if id(c) in kept: c.source = kept[id(c)]
            tags = c.metadata.get("tags", [])
            if "skip-execution" in tags: tags.remove("skip-execution")
            if "tags" in c.metadata and not tags: del c.metadata["tags"]
    log(f"executed {path.name} in {time.time() - t:.0f}s")
    return nb

def executed(path: Path, refresh=False):
    "The executed notebook, from the cache when its fingerprint is unchanged."
    CACHE.mkdir(parents=True, exist_ok=True)
    f = CACHE / f"{path.stem}.{fingerprint(path.stem)}.ipynb"
    if f.exists() and not refresh: return read_nb(f)
    import nbformat
    nb = execute(path)
    for old in CACHE.glob(f"{path.stem}.*.ipynb"): old.unlink()
    tmp = f.with_suffix(".tmp"); nbformat.write(nb, tmp); os.replace(tmp, f)
    return nb

def source_for(path: Path, execute_mode: str):
    "(notebook, how): its committed outputs (the default), an execution (`execute_mode`), or the plain notebook."
    stem, nb = path.stem, read_nb(path)
    wanted = execute_mode == "all" or stem in execute_mode.split(",")
    if has_outputs(nb) and not wanted: return nb, "committed outputs"
    if not wanted and (execute_mode != "missing" or stem in OUTSIDE_SUITE): return nb, "not executed"
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
    if note not in ("executed", "committed outputs"):
        cells.insert(1 if cells and cells[0].cell_type == "markdown" else 0,
                     nbformat.v4.new_markdown_cell(f"*Outputs on this page: {note}.*"))
    nb.cells = cells
    return nb

# --- API reference --------------------------------------------------------------------------------------------
def modules() -> list[str]:
    return [f"mtnlg.{p.stem}" for p in sorted((ROOT / "mtnlg").glob("*.py")) if not p.stem.startswith("_")]

def comments_of(src: str) -> dict[int, list[str]]:
    """Each line's comment in Python source `src` (1-based line: its lines), a comment that continues on the
    comment-only lines below it taken whole (`x: int = 0   # the first line\n             # the second`)."""
    import io, tokenize
    lines, out, last = src.splitlines(), {}, None
    try: toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError): return {}
    for t in toks:
        if t.type != tokenize.COMMENT: continue
        row, text = t.start[0], t.string.lstrip("#").strip()
        alone = not lines[row - 1][:t.start[1]].strip()
        if alone and last is not None and last[1] == row - 1: out[last[0]].append(text); last = (last[0], row)
        elif not alone: out[row] = [text]; last = (row, row)
        else: last = None
    return out

def _args(node, src: str, comments: dict, drop_first: bool) -> list[tuple[str, list]]:
    "(`name: type = default`, its whole comment) per parameter of function node `node`, as its source writes them."
    import ast
    a, seg = node.args, lambda n: ast.get_source_segment(src, n)
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + a.defaults
    items = [(x, d, "") for x, d in zip(pos, defaults)]
    if drop_first and items: items = items[1:]
    if a.vararg: items.append((a.vararg, None, "*"))
    elif a.kwonlyargs: items.append((None, None, "*"))
    items += [(x, d, "") for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg: items.append((a.kwarg, None, "**"))
    out, rows = [], []
    for x, d, star in items:
        if x is None: out.append(("*", [])); rows.append(None); continue
        text = star + x.arg + (f": {seg(x.annotation)}" if x.annotation else "")
        text += (f" = {seg(d)}" if x.annotation else f"={seg(d)}") if d is not None else ""
        out.append((text, comments.get((d or x).end_lineno, [])))
        rows.append((d or x).end_lineno)
    # a comment documents the last parameter on its line
    return [(t, c if r is None or r not in rows[i + 1:] else []) for i, ((t, c), r) in enumerate(zip(out, rows))]

API_WIDTH = 108      # characters of a signature line on the API pages: a code block's width at a 1280 px window

def _commented(items: list[tuple[str, list]], width: int) -> str:
    "Lines `    text  # comment`, the comments aligned and wrapped to API_WIDTH under their first line."
    import textwrap
    out = []
    for text, comment in items:
        lines = textwrap.wrap(" ".join(comment), max(30, API_WIDTH - 4 - width - 4))
        lines = [f"{text if j == 0 else '':<{width}}  # {c}" for j, c in enumerate(lines)]
        out += [f"    {line}".rstrip() for line in lines or [text]]
    return "\n".join(out) + "\n"

def _lines(items: list[tuple[str, list]]) -> str:
    "Parameters one a line with their comments, or on one line when none has a comment."
    if not any(c for _, c in items): return ", ".join(t for t, _ in items)
    return "\n" + _commented([(t + ",", c) for t, c in items], max(len(t) for t, _ in items) + 1)

def signature(obj, name: str) -> str:
    """How the reader's code calls or declares `obj`: `def f(x: int = 0)`, `class C(a, b)` (its constructor),
    `class E(ValueError)`, a dataclass with its fields; each parameter's comment whole."""
    import ast, dataclasses, textwrap
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return f"class {name}({', '.join(b.__name__ for b in obj.__bases__)})"
    try: src = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError): return f"{'class' if inspect.isclass(obj) else 'def'} {name}{inspect.signature(obj)}"
    node, comments = ast.parse(src).body[0], comments_of(src)
    if inspect.isclass(obj):
        lines = src.splitlines()
        deco = "".join(f"@{ast.get_source_segment(src, d)}\n" for d in node.decorator_list)
        head = deco + f"class {name}" + (f"({', '.join(ast.get_source_segment(src, b) for b in node.bases)})"
                                         if node.bases else "")
        if dataclasses.is_dataclass(obj):
            fields = [f for f in node.body if isinstance(f, ast.AnnAssign)]
            body = [" ".join(lines[f.lineno - 1][f.col_offset:f.end_col_offset].split()) for f in fields]
            items = [(b, comments.get(f.end_lineno, [])) for b, f in zip(body, fields)]
            return head + ":\n" + _commented(items, max(map(len, body), default=0)).rstrip("\n")
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if init is None: return head
        return f"class {name}({_lines(_args(init, src, comments, drop_first=True))})"
    ret = f" -> {ast.get_source_segment(src, node.returns)}" if node.returns else ""
    kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{kind} {name}({_lines(_args(node, src, comments, drop_first=False))}){ret}"

def api_page(modname: str) -> str:
    "Markdown for one module: its docstring, then each public function's and class's signature and docstring."
    importlib.import_module("mtnlg.topology")      # quiets megatron-core's import notices before any module loads it
    m = importlib.import_module(modname)
    out = [f"# {modname}", "", inspect.getdoc(m) or "", ""]
    for name in getattr(m, "__all__", []):
        obj = getattr(m, name, None)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)): continue
        doc = inspect.getdoc(obj) if inspect.isfunction(obj) or obj.__doc__ else ""
        out += ["---", "", f"### {name}", "", "```python", signature(obj, name), "```", ""]
        if doc: out += [f"*{doc}*", ""]
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
# Every notebook is committed with its outputs, made by `make outputs` (`write_outputs`). The suite executes each
# once (tests/test_notebooks.py) and compares what it makes with what is committed (`compare`). A notebook too slow
# for the suite (OUTSIDE_SUITE) is executed only by `make outputs`, which records in docs/outputs.json a fingerprint
# of what made its outputs: its code and the library modules it uses (`fingerprint`); the suite checks that.
OUTPUTS_RECORD = ROOT / "docs" / "outputs.json"
OUTSIDE_SUITE = {"12_demo_report": "reads a finished demo run: `make outputs` runs one first, about 9 minutes",
                 "11_train_job": "a training run whose table holds its throughput (tests/test_jobs.py runs it as a "
                                 "job)"}
DEMO_RUN = ROOT / ".build" / "outputs" / "demo"        # the demo run `make outputs` makes for 12_demo_report
# parameters `make outputs` gives a notebook (folders relative to nbs/, made afresh)
PARAMETERS = {"12_demo_report": {"demo_dir": "../.build/outputs/demo"},
              "11_train_job": {"out": "../.build/outputs/train_job"}}
MADE_WITH = {"12_demo_report": ["demo"]}                 # modules that made a notebook's inputs, beside its imports
# The README's figures (docs/images): each the first image among the outputs of the notebook's cell that holds the
# marker, so a figure is byte for byte what the committed notebook shows (`figure_problems` checks it). The check
# compares two committed files that one `make outputs` run wrote together, never a figure drawn on this machine: it
# holds on any CPU. (A figure drawn again elsewhere differs in its pixels' last bits; the numbers behind it are the
# notebook's printed outputs, compared to RTOL where the suite executes them.) Fingerprints hash source, no number.
README_FIGURES = {"training.png": ("12_demo_report", 'save(fig, "training.png")'),
                  "blend.png": ("12_demo_report", 'save(fig, "blend.png")'),
                  "memory.png": ("12_demo_report", 'save(fig, "memory.png")'),
                  "eval.png": ("12_demo_report", 'plots / "eval.png"')}
FIGURES = ROOT / "docs" / "images"

def refresh_command(stem: str) -> str:
    "The command that remakes a notebook's committed outputs (quoted, with how long it takes when it is long)."
    return f"`make outputs STEMS={stem}`" + (f" ({OUTSIDE_SUITE[stem]})" if stem in OUTSIDE_SUITE else "")

def _mtnlg_imports(src: str) -> set[str]:
    "Modules of mtnlg that Python source `src` imports (at any depth, deferred imports too)."
    import ast
    src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))     # IPython's magics
    try: tree = ast.parse(src)
    except SyntaxError: return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1: out |= {base.split(".")[0]} if base else {a.name for a in node.names}
            elif base == "mtnlg": out |= {a.name for a in node.names}
            elif base.startswith("mtnlg."): out.add(base.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("mtnlg.")}
    return out

def library_closure(seeds, root: Path = ROOT) -> list[Path]:
    "The files of mtnlg/ that modules `seeds` import, directly or through others (their own files included)."
    pkg = root / "mtnlg"
    todo, seen = list(seeds), set()
    while todo:
        m = todo.pop()
        f = pkg / f"{m}.py"
        if m in seen or not f.is_file(): continue
        seen.add(m)
        todo += _mtnlg_imports(f.read_text())
    seen.add("__init__")
    files = [pkg / f"{m}.py" for m in sorted(seen)]
    if "tasks" in seen: files += sorted((pkg / "task_yamls").glob("*"))      # data files the tasks module reads
    return [f for f in files if f.is_file()]

def fingerprint(stem: str, root: Path = ROOT) -> str:
    "Hash of what makes a notebook's outputs: its code cells and the library files it uses (`library_closure`)."
    nb = read_nb(root / "nbs" / f"{stem}.ipynb")
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    h = hashlib.sha256()
    for src in code: h.update(src.encode() + b"\0")
    seeds = set().union(*map(_mtnlg_imports, code)) | set(MADE_WITH.get(stem, []))
    for f in library_closure(seeds, root): h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]

def read_record() -> dict:
    return json.loads(OUTPUTS_RECORD.read_text()) if OUTPUTS_RECORD.exists() else {}

def local_paths(text: str) -> str:
    """Output text with this clone's and this user's folders as `<repo>` and `~`, a temporary folder (its random name)
    as `<tmp>`, this host as `<host>`."""
    import socket, tempfile
    text = text.replace(str(ROOT), "<repo>").replace(str(Path.home()) + "/", "~/")
    text = re.sub(rf"{re.escape(tempfile.gettempdir())}/[^/\s'\"():;,]+", "<tmp>", text)
    return re.sub(rf"(?<![\w.-]){re.escape(socket.gethostname())}(?![\w.-])", "<host>", text)

def _norm(text: str) -> str:
    "Output text without what legitimately varies run to run (local paths, addresses, timings, dates, temp paths)."
    text = local_paths(text)
    text = re.sub(r"\b20\d\d-?\d\d-?\d\d[-_T ]?\d\d:?\d\d:?\d\d\b", "<date>", text)       # run folders' names
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    text = re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", text)           # digests of mtnlg's own source (07b_results)
    # what this machine has (02_topology)
    text = re.sub(r"(on this CPU: |cpu_malloc_reuse\(\) \(set: )(True|False)", r"\1?", text)
    text = re.sub(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\]", "[time]", text)      # logging's timestamps
    text = re.sub(r"(/tmp|<tmp>)/[^\s'\"]+", r"\1/?", text)       # a path under a temporary folder, names in it too
    text = re.sub(r"(['\"]\w*(seconds|_s|_per_s|tok_s)['\"]:\s*)[-\d.e+]+", r"\1?", text)   # timing fields of dicts
    return re.sub(r"\d+(\.\d+)?\s*(s|ms|sec|seconds)\b", "? s", text)

def _text(o) -> str:
    t = o.get("text", "")
    return t if isinstance(t, str) else "".join(t)

def output_summary(nb) -> list:
    "Per code cell: (source, its stdout and results as normalised text, its kinds of images, its stderr and errors)."
    out = []
    for c in nb.cells:
        if c.cell_type != "code": continue
        texts, images, noise = [], [], []
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                (texts if o.get("name") == "stdout" else noise).append(_text(o))
            elif o.get("output_type") == "error": noise.append(f"{o.get('ename')}: {o.get('evalue')}")
            else:
                data = o.get("data", {})
                images += [k for k in data if k in IMAGE_TYPES]
                if "text/plain" in data and not any(k in data for k in IMAGE_TYPES):
                    texts.append(data["text/plain"] if isinstance(data["text/plain"], str) else "".join(data["text/plain"]))
        out.append((c.source, _norm("".join(texts)), sorted(images), "".join(noise)))
    return out

def _cell(i: int, src: str) -> str:
    first = next((l for l in src.splitlines() if l.strip() and not l.startswith("#|")), "")
    return f"code cell {i + 1} (`{first[:60]}`)"

def noise(nb) -> list[str]:
    "Cells whose outputs hold stderr (warnings, logs, progress bars) or an error: none is committed."
    return [f"{_cell(i, src)} writes to stderr or fails: {n[:400]!r}"
            for i, (src, _, _, n) in enumerate(output_summary(nb)) if n]

# Numbers in outputs are compared as a reader reads them, the text around them exactly. Another CPU (its vector
# width, its BLAS's path, its thread count) sums in another order and changes a float's last bits, which a number
# printed with enough digits shows (`gnorm 2.119399` here, `2.119398` there); a bf16 step carries such a change up
# to bf16's own precision (4e-3: a loss 7.0299 here, 7.0307 there after two steps). Two printed decimals match when
# they agree to RTOL of their size (three significant digits: a digit that matters differs by more), or lie within
# ATOL of each other (rounding noise around zero: a largest difference 6e-08 here, 1.2e-07 there; -0.0 and 0.0).
# Integers (counts, steps, sizes) and every other character are compared exactly, but for the width of the spaces
# that pad a table's columns (a number one character longer moves them).
RTOL = 1e-3
ATOL = 1e-6
# a decimal with a point or an exponent, signed, not part of a name or a version (`v0.19`, `0.19.2`, `x1.5`)
NUMBER = re.compile(r"(?<![\w.])([-+]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+))(?!\.?\d)")

def numbers_match(x: str, y: str) -> bool:
    "Two printed decimals are the same number as a reader reads it (RTOL, ATOL)."
    a, b = float(x), float(y)
    return abs(a - b) <= max(RTOL * max(abs(a), abs(b)), ATOL)

def first_difference(a: str, b: str) -> int | None:
    "Where output text `a` first differs from `b` as a reader reads it (decimals to RTOL/ATOL), or None."
    pa, pb = NUMBER.split(a), NUMBER.split(b)
    at = 0
    pad = lambda t: re.sub(r"[ \t]+", " ", t)           # a table's padding: runs of spaces as one
    for i, (x, y) in enumerate(zip(pa, pb)):             # text, number, text, number, ..., text
        if i % 2 and not numbers_match(x, y): return at
        if not i % 2 and pad(x) != pad(y):
            return at + next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        at += len(x)
    return None if len(pa) == len(pb) else at

def compare(stem: str, committed, fresh) -> list[str]:
    "Where the committed outputs of notebook `stem` differ from a fresh execution's (`fresh`), or hold noise."
    name = f"nbs/{stem}.ipynb"
    if not has_outputs(committed): return [f"{name}: committed without outputs; run {refresh_command(stem)}"]
    bad = [f"{name}: {p}; fix its source (committed outputs hold no warnings, logs or progress bars)"
           for p in noise(fresh)]
    for i, (a, b) in enumerate(zip(output_summary(committed), output_summary(fresh))):
        if a[0] != b[0]: return bad + [f"{name}: {_cell(i, b[0])}: the committed notebook is not the one executed"]
        k = first_difference(a[1], b[1])
        if k is not None or a[2] != b[2]:
            what, x, y = ("text", a[1], b[1]) if k is not None else ("images", a[2], b[2])
            s = max(0, k - 150) if what == "text" else 0
            bad.append(f"{name}: {_cell(i, a[0])}: committed {what} differs from this run's"
                       f"{f' (at character {k})' if what == 'text' else ''}:\n  committed: {x[s:s + 300]!r}\n"
                       f"  this run:  {y[s:s + 300]!r}\nrun {refresh_command(stem)} if the change is meant")
            break
    return bad

def run_demo_for_outputs(log_to=sys.stderr):
    "A fresh demo run into DEMO_RUN (no report: `write_outputs` executes 12_demo_report on it)."
    code = "import sys; from mtnlg.demo import run_demo; run_demo(sys.argv[1], fresh=True, report=False)"
    subprocess.run([sys.executable, "-c", code, str(DEMO_RUN)], cwd=ROOT, check=True, stdout=log_to)

def write_figures(nb, stem: str):
    "Write the README's figures that notebook `stem` makes (README_FIGURES) from its outputs into docs/images."
    for name, (src_stem, marker) in README_FIGURES.items():
        if src_stem != stem: continue
        png = figure_in(nb, marker)
        if png is None:
            raise SystemExit(f"{stem}: no image in the outputs of the cell with {marker!r} (README_FIGURES)")
        (FIGURES / name).write_bytes(png)
        log(f"docs/images/{name} from {stem}")

def figure_in(nb, marker: str) -> bytes | None:
    "The first PNG among the outputs of the code cell of `nb` whose source holds `marker`, or None."
    for c in nb.cells:
        if c.cell_type == "code" and marker in c.source:
            for o in c.get("outputs", []):
                if "image/png" in o.get("data", {}): return base64.b64decode(o["data"]["image/png"])
    return None

def figure_problems() -> list[str]:
    "README figures that are not byte for byte the image their notebook's committed outputs show."
    bad = []
    for name, (stem, marker) in README_FIGURES.items():
        png = figure_in(read_nb(NBS / f"{stem}.ipynb"), marker)
        f = FIGURES / name
        if png is None: bad.append(f"docs/images/{name}: nbs/{stem}.ipynb shows no image in the cell with {marker!r}")
        elif not f.exists() or f.read_bytes() != png:
            bad.append(f"docs/images/{name} is not the image nbs/{stem}.ipynb shows: run {refresh_command(stem)}")
    return bad

def without_local_paths(nb):
    "`nb` with `local_paths` applied to its text outputs."
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            if "text" in o: o["text"] = local_paths(_text(o))
            for k, v in o.get("data", {}).items():
                if k.startswith("text/"): o["data"][k] = local_paths(v if isinstance(v, str) else "".join(v))
    return nb

def write_outputs(stems: list[str]) -> list[str]:
    """Execute the notebooks `stems` and write them back into nbs/ with their outputs, nbdev-clean (with the README
    figures they make, and the fingerprints of those outside the suite); returns problems (noise, failures)."""
    import nbformat
    from nbclient.exceptions import CellExecutionError
    problems, record = [], read_record()
    for stem in stems:
        path = NBS / f"{stem}.ipynb"
        if stem == "12_demo_report":
            log(f"{stem}: a fresh demo run into {DEMO_RUN.relative_to(ROOT)} (about 9 minutes)")
            run_demo_for_outputs()
        if stem == "11_train_job": shutil.rmtree(NBS / PARAMETERS[stem]["out"], ignore_errors=True)
        try: nb = execute(path, parameters=PARAMETERS.get(stem))
        except CellExecutionError as e:
            problems.append(f"nbs/{stem}.ipynb failed, not written: {str(e)[-1500:]}"); continue
        problems += [f"nbs/{stem}.ipynb: {p}" for p in noise(nb)]
        nb = without_local_paths(nb)
        tmp = path.with_suffix(".tmp"); nbformat.write(nb, tmp); os.replace(tmp, path)
        subprocess.run([str(Path(sys.executable).parent / "nbdev_clean"), "--fname", str(path)], cwd=ROOT, check=True)
        write_figures(nb, stem)
        if stem in OUTSIDE_SUITE:
            record[stem] = {"fingerprint": fingerprint(stem), "made by": f"make outputs STEMS={stem}"}
            OUTPUTS_RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        log(f"{path.name}: outputs written")
    return problems

def check_outputs(stems: list[str]) -> list[str]:
    "Problems: a notebook whose committed outputs differ from a fresh execution (or, outside the suite, stale)."
    from nbclient.exceptions import CellExecutionError
    bad, record = [], read_record()
    for stem in stems:
        path = NBS / f"{stem}.ipynb"
        if stem in OUTSIDE_SUITE:
            if record.get(stem, {}).get("fingerprint") != fingerprint(stem):
                bad.append(f"nbs/{stem}.ipynb: its outputs were made from other code: run {refresh_command(stem)}")
            continue
        try: fresh = execute(path)
        except CellExecutionError as e: bad.append(f"nbs/{stem}.ipynb fails: {str(e)[-1500:]}"); continue
        bad += compare(stem, read_nb(path), fresh)
    return bad + figure_problems()

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--out", default=str(ROOT / "_docs"), help="site folder (default: _docs, ignored by git)")
    ap.add_argument("--execute", default="none", metavar="MODE",
                    help="'none' (default: the committed outputs), 'missing' (notebooks without outputs), 'all', or "
                         "stems a,b (executed, cached in .build/docs)")
    ap.add_argument("--outputs", nargs="*", metavar="STEM", help="execute every notebook (or the STEMs given) and "
                                                                  "write it with its outputs into nbs/")
    ap.add_argument("--check-outputs", nargs="*", metavar="STEM", help="check the committed outputs are current")
    a = ap.parse_args(argv)
    for stem in (a.outputs or []) + (a.check_outputs or []):
        if not (NBS / f"{stem}.ipynb").exists(): ap.error(f"no notebook nbs/{stem}.ipynb")
    every = [p.stem for p in notebooks()]
    if a.outputs is not None:
        t = time.time()
        bad = write_outputs(a.outputs or every)
        log(f"outputs written in {time.time() - t:.0f}s")
        if bad: print("\n".join(bad), file=sys.stderr); return 1
        return 0
    if a.check_outputs is not None:
        bad = check_outputs(a.check_outputs or every)
        if bad: print("\n".join(bad), file=sys.stderr); return 1
        log("committed outputs are current"); return 0
    notes = build(Path(a.out).resolve(), a.execute)["notes"]
    failed = [k for k, v in notes.items() if v.startswith("execution failed")]
    if failed: print(f"notebooks that failed to execute: {', '.join(failed)}", file=sys.stderr); return 1
    return 0

if __name__ == "__main__": sys.exit(main())
