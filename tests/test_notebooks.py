"""Every notebook in nbs/ runs clean through nbdev's notebook test runner (one process per notebook)."""
import sys
import pytest
from conftest import ROOT, run_notebook_tests

sys.path.insert(0, str(ROOT / "docs"))
import build as docs_build       # docs/build.py

pytestmark = pytest.mark.slow      # every notebook, each in a fresh process: about 10 minutes

# The demo report reads a finished demo run: tests/test_demo.py executes it with papermill after a real demo. The
# notebooks committed with outputs (docs/outputs.txt) are executed whole by tests/test_docs.py, which compares them.
EXECUTED_ELSEWHERE = {"12_demo_report", *docs_build.committed_outputs()}
NOTEBOOKS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if p.stem not in EXECUTED_ELSEWHERE)

@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb):
    ok, out = run_notebook_tests(nb)
    assert ok, f"notebook {nb.name} failed:\n{out[-6000:]}"
