"""A real one-node Slurm cluster on localhost for the test suite (Debian's slurmctld/slurmd/munge packages).

`start(root)` installs the packages when missing (apt-get, as root), then starts a private munged, slurmctld and
slurmd: own config file, own munge socket and key, free ports, all state under `root`. Nothing global is touched
(/etc/slurm and /run/munge stay as they are), so it cannot clash with a site Slurm or a second test run. Clients
find the cluster through `SLURM_CONF`, which `start` puts into `os.environ` (jobs inherit it).
`stop()` cancels the cluster's jobs and stops exactly the daemons it started, by their process ids.
`unavailable()` says why Slurm cannot start here (not root, no apt-get), or None.
"""
from __future__ import annotations
import os, shutil, subprocess, time
from pathlib import Path
from conftest import free_port

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = {"slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd", "munged": "/usr/sbin/munged",
            "mungekey": "/usr/sbin/mungekey", "sbatch": "/usr/bin/sbatch"}

def _installed() -> bool:
    return all(Path(p).exists() for p in BINARIES.values())

def unavailable() -> str | None:
    "Why a local Slurm cannot start on this machine, or None when it can."
    if os.geteuid() != 0: return "a local Slurm needs root (slurmd runs jobs as their user; apt-get installs it)"
    if not _installed() and shutil.which("apt-get") is None:
        return f"Slurm is not installed and there is no apt-get to install {' '.join(PACKAGES)}"
    return None

def install(log=print):
    "apt-get install the Debian packages unless their programs are already there."
    if _installed(): return
    log(f"slurm_local: installing {' '.join(PACKAGES)} with apt-get (about 30 s)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES], check=True, env=env)

def _mem_mb() -> int:
    kb = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    return kb // 1024 * 8 // 10

# the daemons, their ports and files, the plugins that work in a container: shared with tests/multihost.py
DAEMONS_CONF = """\
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a requeued job may start again after this many seconds (default 120; each cluster sets its own)
AuthInfo=socket={root}/munge/munge.sock,cred_expire={cred_expire}
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SrunPortRange={srun_lo}-{srun_hi}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# cgroup plugins do not work in this container: Linux process tracking, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
"""

CONF = """\
# Private one-node Slurm for mtnlg's tests (written by tests/slurm_local.py)
ClusterName=mtnlgtest
SlurmctldHost=localhost
""" + DAEMONS_CONF + """\
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# backfill every second (default 30 s; the main pass runs every 60 s): a requeued job, held for cred_expire, starts
# as soon as it may, not at the next pass
SchedulerParameters=bf_interval=1
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
# finished jobs stay visible to scontrol for an hour (there is no slurmdbd, so no sacct)
MinJobAge=3600
KillWait=5
Waittime=0
NodeName=localhost CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

class LocalSlurm:
    "A running private Slurm cluster: its root directory, config file, and the daemons this object started."
    def __init__(self, root): self.root, self.procs, self.conf = Path(root), [], None

    def _spawn(self, name, cmd):
        log = open(self.root / "log" / f"{name}.stdout", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((name, p))
        return p

    def _wait(self, what, ok, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, p in self.procs:
                if p.poll() is not None: raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}:\n{self.logs()}")
            if ok(): return
            time.sleep(0.25)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}:\n{self.logs()}")

    def logs(self, n=20) -> str:
        "The last lines of every daemon log (for error messages)."
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)

    def env(self) -> dict:
        "The environment for Slurm clients of this cluster."
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self, timeout=60):
        "Write the config and key, start munged, slurmctld and slurmd; return when the node is idle."
        r = self.root
        for d in ("state", "spool", "log", "munge"): (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        subprocess.run([BINARIES["mungekey"], "--create", "--force", f"--keyfile={key}"], check=True)
        os.chmod(key, 0o600)
        sock = r / "munge" / "munge.sock"
        self._spawn("munged", [BINARIES["munged"], "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                               f"--pid-file={r}/munge/munged.pid", f"--log-file={r}/log/munged.log",
                               f"--seed-file={r}/munge/munged.seed"])
        self._wait("the munge socket", sock.exists, 15)
        lo = free_port()
        self.conf = r / "slurm.conf"
        # one host that never dies: no RPC to a dead node can be left over, so a requeued job starts after 10 s
        self.conf.write_text(CONF.format(root=r, ctld_port=free_port(), slurmd_port=free_port(), cred_expire=10,
                                         srun_lo=lo, srun_hi=lo + 50 if lo + 50 < 65535 else lo,
                                         cpus=os.cpu_count(), mem_mb=_mem_mb()))
        os.environ["SLURM_CONF"] = str(self.conf)
        self._spawn("slurmctld", [BINARIES["slurmctld"], "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [BINARIES["slurmd"], "-D", "-N", "localhost", "-f", str(self.conf)])
        def idle():
            p = subprocess.run(["sinfo", "-h", "-N", "-n", "localhost", "-o", "%t"], capture_output=True, text=True, env=self.env())
            return p.stdout.strip() == "idle"
        self._wait("the node to be idle in sinfo", idle, timeout)
        return self

    def stop(self):
        "Cancel this cluster's jobs, then stop exactly the daemons started here (reverse order)."
        if self.conf is not None and any(p.poll() is None for n, p in self.procs if n == "slurmctld"):
            subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=self.env(), capture_output=True)
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try: p.wait(15)
                except subprocess.TimeoutExpired: p.kill(); p.wait()
        self.procs.clear()
        if os.environ.get("SLURM_CONF") == str(self.conf): del os.environ["SLURM_CONF"]

def start(root, log=print) -> LocalSlurm:
    "Install when needed and start a private one-node Slurm under `root`."
    install(log)
    s = LocalSlurm(root)
    try: return s.start()
    except BaseException:
        s.stop(); raise

if __name__ == "__main__":  # manual check: python tests/slurm_local.py /tmp/slurm-try
    import sys
    s = start(sys.argv[1] if len(sys.argv) > 1 else "/tmp/mtnlg-slurm")
    print(subprocess.run(["sinfo"], capture_output=True, text=True, env=s.env()).stdout)
    j = subprocess.run(["sbatch", "--parsable", "-n", "2", "-o", f"{s.root}/t-%j.out", "--wrap", "srun -n 2 hostname"],
                       capture_output=True, text=True, env=s.env(), check=True).stdout.strip()
    while subprocess.run(["squeue", "-h", "-j", j], capture_output=True, text=True, env=s.env()).stdout.strip(): time.sleep(0.3)
    print(subprocess.run(["scontrol", "show", "job", j], capture_output=True, text=True, env=s.env()).stdout)
    print(Path(f"{s.root}/t-{j}.out").read_text())
    s.stop()
