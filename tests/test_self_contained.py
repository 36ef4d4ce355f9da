"""A clone is enough: no code in mtnlg/, tests/, nbs/, the Makefile or CI reads a data folder beside the repository
(`../shared`); tests and notebooks read the committed fixtures (tests/data) or what the pinned environment installs.
CI (`.ci/run`) runs the README's test command in a fresh clone with nothing beside it."""
import json, re
from pathlib import Path
from conftest import ROOT

# Ways code names a folder beside the repository: relative paths, the repo's parent joined with "shared", the old
# environment variable and the absolute path of this project's working setup.
BESIDE = re.compile("|".join([r"\.\./(?:\.\./)*shared\b", r"\bshared/data\b", r"MTNLG_SHARED", r"/work/shared",
                              r"""(?:\.parent|parents\[\d+\])\s*/\s*["']shared""", r"""["']shared["']\s*/\s*["']data"""]))


def sources(root: Path) -> dict[str, str]:
    "{path: text} of the code that runs: mtnlg/ and tests/ Python, the notebooks' cells (source and outputs), make, CI."
    files = sorted(root.glob("mtnlg/*.py")) + sorted(root.glob("tests/**/*.py")) + [root / "Makefile", root / ".ci/run"]
    out = {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in files if p.is_file()}
    for nb in sorted(root.glob("nbs/*.ipynb")) + sorted(root.glob("tests/notebooks/*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        out[str(nb.relative_to(root))] = "\n".join("".join(c["source"]) + json.dumps(c.get("outputs", []))
                                                   for c in cells if c["cell_type"] == "code")
    return out


def beside_the_repo(files: dict[str, str]) -> list[str]:
    "'path:line: text' of every line that names a folder beside the repository."
    return [f"{path}:{i}: {line.strip()[:120]}" for path, text in files.items()
            for i, line in enumerate(text.split("\n"), 1) if BESIDE.search(line)]


def test_the_check_catches_each_way_of_naming_the_folder_beside():
    "Positive control: every pattern the suite once used is caught; a 'shared' that is not a path is not."
    bad = ['SHARED = Path("../../shared/data")', 'd = ROOT.parent / "shared" / "data"',
           'p = Path(mtnlg.__file__).resolve().parents[1].parent / "shared"', 'os.environ.get("MTNLG_SHARED")',
           'open("/work/shared/data/eval/x")', 'x = base / "shared" / "data" / "eval"']
    good = ['"shared-memory comm op"', 'tmp_path / "same_out"', '# the index is shared across sources']
    assert len(beside_the_repo({f"bad{i}": b for i, b in enumerate(bad)})) == len(bad)
    assert beside_the_repo({f"good{i}": g for i, g in enumerate(good)}) == []


def test_no_code_reads_a_folder_beside_the_repository():
    found = beside_the_repo({p: t for p, t in sources(ROOT).items() if p != "tests/test_self_contained.py"})
    assert found == [], "read tests/data (committed fixtures) or installed data instead:\n" + "\n".join(found)


def test_ci_runs_the_readme_command_in_a_clone_with_nothing_beside_it():
    ci = (ROOT / ".ci/run").read_text()
    assert "git clone" in ci and "make test" in ci and "mktemp -d" in ci and "rm -rf" in ci
