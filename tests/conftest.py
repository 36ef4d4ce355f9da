"""Shared helpers for the test suite."""
import os, subprocess, sys
from pathlib import Path
import pytest

# the multi-host Slurm cluster fixture (tests/multihost_fixture.py), shared by the whole session
pytest_plugins = ["multihost_fixture"]

ROOT = Path(__file__).resolve().parents[1]
# The committed fixtures (tests/data/README.md: sources, subsets, licences): the tests read nothing beside the repo.
DATA = ROOT / "tests" / "data"

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

def run_notebook_tests(nb_path, timeout=1200):
    """Execute one notebook in a fresh kernel as nbdev's test runner would (`#| eval: false` and skip-flagged cells
    not run; docs/build.py's `execute`, as tests/test_notebooks.py does); (ok, the failing cell's traceback)."""
    sys.path.insert(0, str(ROOT / "docs"))
    import build as docs_build
    from nbclient.exceptions import CellExecutionError
    try: docs_build.execute(Path(nb_path), timeout=timeout)
    except CellExecutionError as e: return False, str(e)
    return True, ""

def free_port() -> int:
    "A free TCP port on localhost (the kernel's choice)."
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def free_port_block(n: int) -> int:
    "First of `n` consecutive free ports below the ephemeral range (where a launch's own client sockets land)."
    import random, socket
    for _ in range(200):
        start = random.randrange(15000, 30000 - n)
        try:
            for q in range(start, start + n):
                with socket.socket() as s: s.bind(("127.0.0.1", q))
            return start
        except OSError: continue
    raise RuntimeError(f"no {n} consecutive free ports in 15000-30000")

@pytest.fixture(scope="session")
def fixture_data():
    "tests/data: evaluation sets in their official layouts (eval/) and real text (corpus/), committed."
    return DATA


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    "A private one-node Slurm on localhost for the session (tests/slurm_local.py); its daemons stop at the end."
    import slurm_local
    why = slurm_local.unavailable()
    if why: pytest.skip(f"cannot start a local Slurm: {why}")
    cluster = slurm_local.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


# Disk `make test` takes at most once .venv is made (the wheel test's two venvs, 8 GB, and the tests' files, 7.1 GB:
# benchmarks/RESULTS.md, "Test suite time"); checked before any test
SUITE_DISK_GB = float(os.environ.get("MTNLG_SUITE_DISK_GB", 16))
STALE_ROOT_HOURS = 3      # another session's root older than this has ended (a full run takes under an hour)

# Deprecations raised by megatron-core, DeepSpeed, lm-eval, datatrove or mtnlg are errors (tests/strict/*.py)
STRICT = Path(__file__).resolve().parent / "strict"

def _strict_deprecations(config):
    "The rule of tests/strict here (as filterwarnings lines) and in every Python process the tests start."
    sys.path.insert(0, str(STRICT))
    import strict_deprecations
    for action, message, category, module in strict_deprecations.rules():
        config.addinivalue_line("filterwarnings", f"{action}:{message}:{category.__name__}:{module}")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STRICT), os.environ.get("PYTHONPATH")]))

def pytest_configure(config):
    "The `slow` marker; each session its own temp root (pytest prunes all but the 3 newest, a running one's too)."
    _strict_deprecations(config)
    config.addinivalue_line("markers", "slow: multi-process launches, notebooks, the demo, the docs site, the wheel "
                                       "(`make test` runs them; `make test-fast` leaves them out)")
    if not config.option.basetemp:
        import tempfile
        _prune_stale_roots(Path(tempfile.gettempdir()))
        if config.getoption("numprocesses", None) and not config.getoption("markexpr"):   # `make test`'s run
            _check_free_disk(Path(tempfile.gettempdir()))
        config.option.basetemp = tempfile.mkdtemp(prefix="mtnlg-pytest-")
        config._mtnlg_own_basetemp = True
        # what tests and their processes make in the temp dir goes with the session's root: beside it (pytest
        # empties the root when it first makes a test's folder, without xdist)
        os.environ["TMPDIR"] = config.option.basetemp + "-tmp"
        os.mkdir(os.environ["TMPDIR"])
        tempfile.tempdir = None


def _prune_stale_roots(tmp: Path):
    "Remove the temp roots that failed sessions kept, once they are stale (they filled the disk of a later run)."
    import shutil, time
    for root in tmp.glob("mtnlg-pytest-*"):
        try: stale = time.time() - root.stat().st_mtime > STALE_ROOT_HOURS * 3600
        except FileNotFoundError: continue                  # its own session removed it meanwhile
        if stale: shutil.rmtree(root, ignore_errors=True)


def _check_free_disk(tmp: Path):
    "Refuse a full run at once when its temp dir lacks the room the suite writes (not as errors after 30 minutes)."
    import shutil
    free_gb = shutil.disk_usage(tmp).free / 2**30
    if free_gb < SUITE_DISK_GB:
        raise pytest.UsageError(f"the suite writes up to {SUITE_DISK_GB:.0f} GB under {tmp}, which has "
                                f"{free_gb:.1f} GB free: free some, or point TMPDIR at a disk with room "
                                "(MTNLG_SUITE_DISK_GB sets the need)")


def pytest_xdist_node_collection_finished(node, ids):
    "Stop at once if `--dist loadgroup` lost the groups (files would split, their fixtures built twice)."
    if node.config.getoption("dist") == "loadgroup" and any("@" not in i for i in ids):
        pytest.exit("pytest-xdist's --dist loadgroup lost the test groups (pytest-xdist#1386: pytest 9.2 with xdist "
                    "3.8); install the pinned pytest of environments/cpu.txt", returncode=pytest.ExitCode.USAGE_ERROR)


# `make test` runs two pytest-xdist workers (--dist loadgroup): the suite waits on processes half of the time
# (launches, Slurm, sockets), so two files at once use both cores. A file's tests stay together (its module
# fixtures are built once); files sharing a session fixture (the one-host or the multi-host Slurm) or running
# nbs/ go to one worker.
SHARED_GROUPS = {"test_jobs": "slurm", "test_data": "slurm", "test_hosts": "multihost", "test_multihost": "multihost",
                 "test_curation_hosts": "multihost", "test_notebooks": "nbs", "test_docs": "nbs"}

# Seconds of pytest time each group took in the last measured `make test` (benchmarks/RESULTS.md, 2026-11-29,
# fifth session: its summary's "seconds per xdist group" line). The Makefile passes --no-loadscope-reorder, so
# the workers take groups in this order, longest first, and end together (xdist's own order is by number of tests: a long group of few
# tests started last made the suite wait on it alone). Groups not named here follow in collection order.
GROUP_SECONDS = {"nbs": 599, "multihost": 511, "slurm": 220, "test_train": 174, "test_package": 151, "test_alive": 150,
                 "test_checkpoint": 147, "test_dryrun": 128, "test_studies": 122, "test_demo": 98, "test_eval": 78,
                 "test_curation_scale": 55, "test_fast_step": 53, "test_pipelined_scoring": 49, "test_parallel": 45}

def _group(item) -> str:
    "The xdist group of a collected test."
    return item.get_closest_marker("xdist_group").args[0]

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    "Each test's xdist group: its file, or the group its file shares (`SHARED_GROUPS`); the longest groups first."
    for item in items:
        stem = item.path.stem
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(stem, stem)))
    first_seen = {}
    for i, item in enumerate(items): first_seen.setdefault(_group(item), i)
    items.sort(key=lambda item: (-GROUP_SECONDS.get(_group(item), 0), first_seen[_group(item)]))


def pytest_terminal_summary(terminalreporter):
    "Seconds per xdist group (set-up, call and tear-down of its tests): the figures GROUP_SECONDS is updated from."
    seconds = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            if "@" not in nodeid or not getattr(report, "when", None): continue
            group = nodeid.rsplit("@", 1)[1]
            seconds[group] = seconds.get(group, 0) + report.duration
    if len(seconds) > 1:
        longest_first = sorted(seconds.items(), key=lambda pair: -pair[1])
        terminalreporter.write_sep("=", "seconds per xdist group")
        terminalreporter.write_line(", ".join(f"{group} {s:.0f}" for group, s in longest_first))


def pytest_sessionfinish(session, exitstatus):
    "Remove this session's temp root when every test passed (kept for inspection after a failure)."
    import shutil
    if getattr(session.config, "_mtnlg_own_basetemp", False) and exitstatus == 0:
        shutil.rmtree(session.config.option.basetemp, ignore_errors=True)
        shutil.rmtree(session.config.option.basetemp + "-tmp", ignore_errors=True)
