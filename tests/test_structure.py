"""The house: the import graph of mtnlg/ (derived from the source) has no circle and nothing imports upward; modules
stay small, say in full what they are for, keep their privates to themselves, and reach into a library's
private internals only through mtnlg/patches.py."""
import ast, re
from pathlib import Path
import pytest
from conftest import ROOT

# bottom to top: a module may import only modules listed before it (README, "The house")
LAYERS = ["config", "stats", "patches", "placement", "plan", "topology", "model", "pipeline", "checkpoint_folders", "checkpoint", "dryrun", "tokenizer", "tasks", "runs",
          "jobs", "flags", "decontam", "data", "indexed", "curation_steps", "dedup", "curation", "corpus", "train", "generate",
          "results", "eval", "session", "export", "demo", "cli"]
MAX_LINES = 700
# private names of torch, DeepSpeed, megatron-core and lm-eval the project uses: only patches.py may name them
LIBRARY_PRIVATES = ["_take_model_step", "_partition_layers", "_set_bounds", "_hp_optimizer_states_linked",
                    "_lazy_init_hp_params_optimizer_state", "_hp_mapping", "_get_cuda_rng_state",
                    "_set_cuda_rng_state", "_yaml_loader", "_is_mkldnn_bf16_supported", "_WORLD_GROUP",
                    "_DATA_PARALLEL_GROUP", "build_shm_op", "add_env_info", "get_git_commit_hash", "_StorageInfo",
                    "_rebuild_tensor_v2", "_dynamo.config", "_python_dispatch", "_subclasses", "testing._internal",
                    "fake_collectives", "_recv_tensor_meta", "_INSTRUCTION_MAP", "_scaled_dot_product_flash_attention",
                    "_local_scalar_dense"]


def module_sources(root: Path) -> dict:
    "{module name: source} of a package folder (not its generated index)."
    return {p.stem: p.read_text() for p in sorted(root.glob("*.py")) if p.stem not in ("__init__", "_modidx")}


def imports(src: str, package: str = "mtnlg") -> list[tuple[str, int, bool]]:
    "(sibling module, line, inside a function) of every import of a module of `package` in `src`."
    tree, out = ast.parse(src), []
    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level == 1 and not base:
                    out.extend((a.name, child.lineno, nested) for a in child.names)
                elif child.level == 1: out.append((base.split(".")[0], child.lineno, nested))
                elif base == package: out.extend((a.name, child.lineno, nested) for a in child.names)
                elif base.startswith(package + "."): out.append((base.split(".")[1], child.lineno, nested))
            elif isinstance(child, ast.Import):
                out.extend((a.name.split(".")[1], child.lineno, nested) for a in child.names
                           if a.name.startswith(package + "."))
            visit(child, inner)
    visit(tree, False)
    return out


def graph(sources: dict) -> dict:
    "{module: set of sibling modules it imports}."
    return {m: {d for d, _, _ in imports(s) if d in sources and d != m} for m, s in sources.items()}


def cycles(g: dict) -> list[list[str]]:
    "Every import circle of graph `g`, each as the path that closes it."
    found, state = [], {}
    def dfs(m, path):
        state[m] = "open"
        for d in sorted(g.get(m, ())):
            if state.get(d) == "open": found.append(path[path.index(d):] + [d])
            elif d not in state: dfs(d, path + [d])
        state[m] = "done"
    for m in sorted(g):
        if m not in state: dfs(m, [m])
    return found


def upward(g: dict, layers: list[str]) -> list[str]:
    "Imports of a module listed later in `layers` (or of one missing from it)."
    rank = {m: i for i, m in enumerate(layers)}
    bad = [f"{m} is not in LAYERS" for m in g if m not in rank]
    return bad + [f"{m} imports {d}" for m, ds in g.items() for d in sorted(ds)
                  if m in rank and rank.get(d, 10 ** 6) > rank[m]]


SOURCES = module_sources(ROOT / "mtnlg")


def test_the_checks_catch_a_circle_and_an_upward_import():
    "Positive control: a made-up package with a circle and an upward import fails both checks."
    fake = {"low": "from .high import thing\n", "high": "def f():\n    from mtnlg import low\n"}
    g = graph(fake)
    assert g == {"low": {"high"}, "high": {"low"}}
    assert cycles(g) and upward(g, ["low", "high"]) == ["low imports high"]
    assert imports(fake["high"]) == [("low", 2, True)]


def test_no_import_circle_and_nothing_imports_upward():
    g = graph(SOURCES)
    assert set(g) == set(LAYERS), f"modules {sorted(set(g) ^ set(LAYERS))}: add them to LAYERS (and the README)"
    assert cycles(g) == []
    assert upward(g, LAYERS) == []


def test_sibling_imports_sit_at_the_top_or_say_why():
    "An import of a sibling module inside a function carries a comment saying why (a cycle, start-up cost)."
    bad = []
    for m, src in SOURCES.items():
        lines = src.split("\n")
        for d, line, nested in imports(src):
            if nested and "#" not in lines[line - 1] + lines[line - 2]: bad.append(f"{m}.py:{line} imports {d}")
    assert bad == []


def test_modules_are_small_and_say_what_they_are_for():
    for m, src in SOURCES.items():
        n = src.count("\n")
        assert n <= MAX_LINES or f"longer than {MAX_LINES} lines" in src[:2000], f"{m}.py: {n} lines"
        doc = ast.get_docstring(ast.parse(src))
        assert doc and doc.endswith((".", ")")) and len(doc.split()) >= 8, f"{m}.py: docstring {doc!r}"


def test_privates_stay_home_and_library_internals_live_in_patches():
    crossing = [f"{m}: from {d} import {n}" for m, src in SOURCES.items()
                for d, n in re.findall(r"from (?:\.|mtnlg\.)(\w+) import \(?([^)\n]*)", src)
                for n in [x.strip().split(" ")[0] for x in n.split(",")] if n.startswith("_") and n != "__version__"]
    assert crossing == []
    reach = [f"{m}: {p}" for m, src in SOURCES.items() if m != "patches" for p in LIBRARY_PRIVATES if p in src]
    assert reach == [], "use mtnlg.patches for these"


def test_patches_are_at_the_versions_they_were_checked_against():
    "Every private internal of a library the project uses still exists, at the version it was checked against."
    from mtnlg.patches import check_patches, PATCHES
    assert {p.library for p in PATCHES.values()} >= {"deepspeed", "megatron-core", "torch", "lm-eval"}
    assert check_patches() == []


TP_COPY = ("import torch; from mtnlg.config import ParallelConfig; from mtnlg.topology import init_distributed, shutdown; "
           "from megatron.core import parallel_state as ps, tensor_parallel as tpl; init_distributed(ParallelConfig()); "
           "tpl.copy_to_tensor_model_parallel_region(torch.ones(2){}); shutdown(); print('ran')")

def test_library_deprecations_are_errors_here_and_in_started_processes():
    "tests/strict: megatron-core's deprecation of a call without its group fails a started process; the group passes."
    import subprocess, sys, warnings
    run = lambda code: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    without, given = run(TP_COPY.format("")), run(TP_COPY.format(", group=ps.get_tensor_model_parallel_group()"))
    assert without.returncode != 0 and "DeprecationWarning: Warning: tp_group is None" in without.stderr, without
    assert given.returncode == 0 and given.stdout.strip() == "ran", given.stderr[-3000:]
    # here too: a library's deprecation raises, another package's stays a warning (the control)
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("old", DeprecationWarning, "layers.py", 1, module="megatron.core.tensor_parallel.layers")
    with pytest.warns(DeprecationWarning):
        warnings.warn_explicit("old", DeprecationWarning, "x.py", 1, module="numpy.linalg")
