"""A real Slurm cluster of several hosts on this machine (tests/multihost.py): hosts, rendezvous, a second cluster.

Each host is its own network, UTS and mount namespace with its own address, hostname and slurmd, so a job's
ranks on h1 and h2 talk over TCP between two addresses as on two machines. These tests check the cluster itself
and what the multi-host paths rely on: `srun` across hosts, a torchrun c10d rendezvous with a gloo all_reduce
across hosts. Slurm requeueing a job after one host dies (only that host's processes die, the job waits for it,
then runs on both again) is checked with a training job in tests/test_hosts.py, on the same session cluster.
They need root (namespaces); elsewhere they skip.
"""
import collections, json, os, socket, subprocess
from pathlib import Path
import pytest
import multihost


def ranks(cluster, job: str) -> list[dict]:
    "What each rank of tests/rendezvous_worker.py reported in `job` (its ranks-JOB folder), by rank."
    files = sorted((cluster.root / "jobs" / f"ranks-{job}").glob("rank-*.json"))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])

# ---------------------------------------------------------------- the cluster itself

def test_root_machine_can_run_the_cluster():
    "CI here is root: the multi-host tests must run there, not skip."
    if os.geteuid() != 0: pytest.skip("not root: unavailable() gives the reason and the cluster tests skip")
    assert multihost.unavailable() is None

def test_unavailable_names_the_reason_when_not_root():
    if os.geteuid() != 0: pytest.skip("needs root to check the answer as another user")
    assert multihost.unavailable() is None            # positive control: as root the cluster can start
    os.seteuid(65534)                                 # the effective user only: the saved root id brings it back
    try:
        why = multihost.unavailable()
    finally:
        os.seteuid(0)
    assert why is not None and "needs root" in why

def test_two_nodes_show_two_hostnames_and_addresses(multihost_cluster):
    c = multihost_cluster
    assert c.node_states() == {"h1": "idle", "h2": "idle"}
    j = c.submit("#!/bin/bash\nsrun bash -c 'echo HOST $(hostname) $(hostname -I)'\n", "-N", "2",
                 "--ntasks-per-node=1", name="hosts")
    info = c.wait_job(j, timeout=60)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "h[1-2]", info
    seen = sorted(tuple(l.split()[1:]) for l in c.output(j, "hosts").splitlines() if l.startswith("HOST "))
    assert seen == [("h1", c.addresses["h1"]), ("h2", c.addresses["h2"])]
    assert c.addresses["h1"] != c.addresses["h2"]
    # the job ran in the hosts' namespaces, not in this machine's: its own name and /etc/hosts are untouched
    assert socket.gethostname() not in ("h1", "h2")
    assert c.net not in Path("/etc/hosts").read_text()
    on_h2 = c.on_host("h2", "hostname; getent hosts h1; ip -4 -o addr show eth0")
    assert on_h2.returncode == 0, on_h2.stderr
    name, h1_entry, addr = on_h2.stdout.splitlines()
    assert name == "h2" and h1_entry.split() == [c.addresses["h1"], "h1"] and f"{c.addresses['h2']}/24" in addr

def mount_points() -> set[str]:
    "Mount points of this (the root) mount namespace."
    return {l.split()[4] for l in Path("/proc/self/mountinfo").read_text().splitlines()}

def test_second_cluster_coexists_and_stop_leaves_nothing(multihost_cluster, tmp_path):
    c = multihost_cluster
    mounts, hosts_file = mount_points(), Path("/etc/hosts").read_text()
    other = multihost.start(tmp_path / "other", hosts=1, tag="mhother")
    try:
        # nothing global: the hosts' /etc/hosts and namespaces are mounted inside their own mount namespaces
        new = mount_points() - mounts
        assert not [m for m in new if "netns" in m or m == "/etc/hosts" or str(tmp_path) in m], new
        assert Path("/etc/hosts").read_text() == hosts_file
        assert other.net != c.net and other.bridge != c.bridge
        j = other.submit("#!/bin/bash\nsrun hostname\n", name="other")
        assert other.wait_job(j, timeout=60)["JobState"] == "COMPLETED"
        assert other.output(j, "other").strip() == "h1"
        pids = [p.pid for p in other.procs.values()]
        assert other.leftovers(), "the leftovers check must see a running cluster (positive control)"
    finally:
        other.stop()
    assert other.leftovers() == []
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith("mhother")]
    assert "mhother" not in subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    assert not [p for p in pids if Path(f"/proc/{p}").exists()], "a daemon of the stopped cluster still runs"
    assert c.node_states() == {"h1": "idle", "h2": "idle"}, "stopping one cluster must not touch the other"

# ---------------------------------------------------------------- rendezvous across hosts

def test_torchrun_rendezvous_across_two_hosts(multihost_cluster):
    c = multihost_cluster
    j = c.submit(multihost.torchrun_script(nodes=2, nproc_per_node=2), "-N", "2", "--ntasks-per-node=1",
                 "--time=00:05:00", name="rdzv")
    info = c.wait_job(j, timeout=300)
    out = c.output(j, "rdzv")
    assert info["JobState"] == "COMPLETED", out
    got = ranks(c, j)
    assert sorted(r["rank"] for r in got) == [0, 1, 2, 3] and {r["world_size"] for r in got} == {4}
    assert {r["sum"] for r in got} == {10.0}                       # 1 + 2 + 3 + 4
    assert collections.Counter(r["host"] for r in got) == {"h1": 2, "h2": 2}
    for host, group in (("h1", 0), ("h2", 1)):                      # torchrun's node (group) and local ranks
        mine = [r for r in got if r["host"] == host]
        assert {r["group_rank"] for r in mine} == {group} and sorted(r["local_rank"] for r in mine) == [0, 1]
    assert {r["master_addr"] for r in got} == {"h1"}

# ---------------------------------------------------------------- more hosts

@pytest.mark.parametrize("multihost_cluster", [3], indirect=True)
def test_three_host_cluster_on_request(multihost_cluster):
    c = multihost_cluster
    assert c.node_states() == {"h1": "idle", "h2": "idle", "h3": "idle"} and len(set(c.addresses.values())) == 3
    j = c.submit("#!/bin/bash\nsrun hostname\n", "-N", "3", "--ntasks-per-node=1", name="three")
    assert c.wait_job(j, timeout=60)["JobState"] == "COMPLETED"
    assert sorted(c.output(j, "three").split()) == ["h1", "h2", "h3"]
