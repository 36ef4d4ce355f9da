"""pytest plugin: the `multihost_cluster` session fixture (a real Slurm of namespace hosts), the `slow` marker.

Loaded by `pytest_plugins = ["multihost_fixture"]` in tests/conftest.py (so every test module can use the one
session cluster, and `slow` is registered before test modules are imported).
The cluster has 2 hosts; a test asks for another number with
`@pytest.mark.parametrize("multihost_cluster", [3], indirect=True)` (one cluster per host count and session).
It skips, with the reason, where the machine cannot make namespaces (not root, no unshare/nsenter/ip).
"""
import pytest
import multihost

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than about a minute (multi-host Slurm: host death)")

@pytest.fixture(scope="session")
def multihost_cluster(request, tmp_path_factory):
    "A private Slurm cluster of 2 (or `request.param`) hosts stopped, leaving nothing, at the end."
    hosts = getattr(request, "param", 2)
    why = multihost.unavailable()
    if why: pytest.skip(f"cannot start a multi-host Slurm: {why}")
    cluster = multihost.start(tmp_path_factory.mktemp(f"multihost{hosts}-"), hosts)
    yield cluster
    cluster.stop()
    left = cluster.leftovers()
    assert not left, f"the multi-host cluster left {left} behind"
