"""A real Slurm cluster of several hosts on this one machine, for the test suite (Debian's Slurm and munge).

Each host `h1`, `h2`, ... is its own network namespace (its own address on a private bridge that this module
makes), UTS namespace (its own hostname) and mount namespace (its own `/etc/hosts`), with its own `slurmd`;
one `slurmctld` (in a UTS namespace named `ctl`, as it must see its own name as `SlurmctldHost`) and one
`munged` run beside them. The file system is shared by all hosts, as NFS or Lustre is on a real cluster.
Everything a host's slurmd starts (batch scripts, srun steps, torchrun and its ranks) lives in that host's
namespaces, so ranks on `h1` and `h2` talk over TCP between two addresses, as on two machines.

A host's namespaces belong to one small "machine" process (`sleep infinity` under `unshare`), not to a name
under /run/netns: `kill_host` kills every other process on the host (slurmd, slurmstepd, the job) and leaves
the machine with its address, as a crashed node's network port stays; `stop` kills the machines last and the
namespaces go with them. `ip netns` is not used, so /run/netns is neither made nor mounted.

`start(root, hosts=2)` installs the packages when missing (as tests/slurm_local.py does), then starts it all;
`stop()` cancels the jobs and stops exactly what `start` made: its daemons by process id, every process left on
its hosts, the links and the hosts' namespaces. Names derive from a tag (bridge `TAGbr`, veths `TAGv1`..) and
the subnet is one no route uses yet, so two clusters can run at once; nothing global is changed (`/etc/hosts`
is replaced only inside the hosts' private mount namespaces; `os.environ` is not touched: clients get
`SLURM_CONF` from `env()`). `unavailable()` says why it cannot run here, or None.

What it took (each was a failure first, see the issue's reference recipe):
- `ip netns exec` remounts /sys, which hides /sys/fs/cgroup, and slurmd then fails: enter with `nsenter`.
- slurmctld refuses to start unless its hostname is the SlurmctldHost name: a UTS namespace named `ctl`.
- Each host declares `cpus_per_host` CPUs (SlurmdParameters=config_overrides): 4 ranks a host on 2 real CPUs.
- A namespace is freed asynchronously after its last process: the veth is deleted from the bridge's side first.
- A requeued job started 11 s after its requeue (cred_expire=10) and, ~40 s later, slurmctld's retry of the
  step signal the dead host had missed killed its step J.0 there: cred_expire is 90 here (CRED_EXPIRE).
"""
from __future__ import annotations
import os, re, shlex, shutil, subprocess, sys, time, zlib
from pathlib import Path
import slurm_local

NAMESPACE_TOOLS = ("unshare", "nsenter", "ip")
SLURMD_PORT = 6818          # each host has its own network namespace, so all slurmds can use the same port
# A requeued job starts again cred_expire + 1 s after its requeue. An RPC that slurmctld could not deliver to a dead
# host stays in its retry list and goes out again 60 s after the failed try (RPC_RETRY_INTERVAL), once the host
# answers: srun's --kill-on-bad-exit signal of step J.0 (sent when the host died) then kills step J.0 of the
# requeued job, the same job and step id. 90 s (> 60 s + a failed try's 10-12 s) lets it land before the new start.
CRED_EXPIRE = 90

def unavailable() -> str | None:
    "Why a multi-host Slurm cannot start on this machine, or None when it can."
    if os.geteuid() != 0: return "a multi-host Slurm needs root (network namespaces, a bridge, slurmd)"
    missing = [t for t in NAMESPACE_TOOLS if shutil.which(t) is None]
    if missing: return f"no {' '.join(missing)} on PATH (util-linux and iproute2 make the hosts' namespaces)"
    why = slurm_local.unavailable()
    if why: return why
    # a throwaway network namespace: can this machine make namespaces, a bridge and a veth pair at all?
    probe = ("ip link add name pbr type bridge && ip link add name pv type veth peer name pp && "
             "ip link set pv master pbr")
    p = subprocess.run(["unshare", "--net", "--uts", "--mount", "sh", "-c", probe], capture_output=True, text=True)
    if p.returncode: return f"cannot make network/UTS/mount namespaces with a bridge here: {p.stderr.strip()}"
    return None

def _used_subnets() -> set[int]:
    "Third octets of the 10.77.X.0/24 subnets some route already uses."
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    return {int(m) for m in re.findall(r"\b10\.77\.(\d+)\.", routes)}

def _pick_subnet(tag: str) -> str:
    "A free 10.77.X subnet, X derived from the tag (so two clusters pick different ones)."
    used = _used_subnets()
    first = zlib.crc32(tag.encode()) % 200 + 20
    for k in range(200):
        octet = (first - 20 + k) % 200 + 20
        if octet not in used: return f"10.77.{octet}"
    raise RuntimeError("multihost: every subnet 10.77.20-219.0/24 is in use; stop the other clusters first")

CONF = """\
# Private {n}-host Slurm for mtnlg's tests (written by tests/multihost.py)
ClusterName={tag}
SlurmctldHost=ctl({net}.1)
""" + slurm_local.DAEMONS_CONF + """\
# backfill every second (default 30 s): a requeued job, held for cred_expire, starts as soon as it may
SchedulerParameters=bf_interval=1
MpiDefault=none
MailProg=/bin/true
# a host that was down (not responding) comes back as soon as its slurmd registers again
ReturnToService=2
# each host declares more CPUs than the machine has (2 here), so that 4 ranks fit on each host
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
# a host that stops answering is marked down after this many seconds (pinged every third of it). Measured
# here (slurm 22.05): 1-4 s mark a killed host down ~15 s after its death, 5-10 s ~27 s, 20 s ~33 s.
SlurmdTimeout={slurmd_timeout}
InactiveLimit=0
# finished jobs stay visible to scontrol for an hour (there is no slurmdbd, so no sacct)
MinJobAge=3600
KillWait=5
Waittime=0
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

WORKER = Path(__file__).resolve().parent / "rendezvous_worker.py"

def torchrun_script(nodes: int, nproc_per_node: int, prelude: str = "") -> str:
    "A batch script: one torchrun a host (srun), c10d rendezvous at the first host, the rendezvous worker."
    return f"""#!/bin/bash
{prelude}export OMP_NUM_THREADS=1
MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
PORT=$((29400 + SLURM_JOB_ID % 500))
mkdir -p "ranks-$SLURM_JOB_ID"
srun --nodes={nodes} --ntasks-per-node=1 {sys.executable} -m torch.distributed.run --nnodes={nodes} \\
  --nproc-per-node={nproc_per_node} --rdzv-backend=c10d --rdzv-endpoint=$MASTER:$PORT --rdzv-id=$SLURM_JOB_ID \\
  --max-restarts=0 {WORKER} "$PWD/ranks-$SLURM_JOB_ID"
"""

def parse_fields(line: str) -> dict:
    "`Key=Value Key=Value ...` (one line of `scontrol show -o`) as a dict; values may contain spaces."
    keys = list(re.finditer(r"(?:^|\s)([A-Za-z][\w:/]*)=", line))
    return {m.group(1): line[m.end():keys[i + 1].start() if i + 1 < len(keys) else len(line)].strip()
            for i, m in enumerate(keys)}

_started = []

def _default_tag() -> str:
    "mh + this process's id + a letter a, b, ... for each cluster it makes (at most 10 characters)."
    _started.append(None)
    return f"mh{os.getpid() % 100000}{'abcdefghijklmnopqrstuvwxyz'[(len(_started) - 1) % 26]}"

class MultiHostSlurm:
    "A running private Slurm cluster of several namespace hosts: its root, tag, hosts, addresses and daemons."
    def __init__(self, root, hosts: int = 2, tag: str | None = None, cpus_per_host: int = 4,
                 slurmd_timeout: int = 4):
        if not 1 <= hosts <= 99: raise ValueError(f"hosts={hosts}: want 1..99")
        self.root = Path(root).resolve()
        self.tag = tag or _default_tag()
        if not re.fullmatch(r"[a-z][a-z0-9]{0,9}", self.tag):
            raise ValueError(f"tag {self.tag!r}: want 1-10 lower-case letters/digits starting with a letter "
                             "(interface names are at most 15 characters)")
        self.hosts = [f"h{i}" for i in range(1, hosts + 1)]
        self.cpus_per_host, self.slurmd_timeout = cpus_per_host, slurmd_timeout
        self.bridge = f"{self.tag}br"
        self.net, self.addresses, self.conf = None, {}, None
        self.procs: dict[str, subprocess.Popen] = {}     # name -> the process this object started
        self.links: list[str] = []                        # the links made here, in order
        self.host_ns: dict[str, str] = {}                 # host -> its network namespace ("net:[inode]")

    # ------------------------------------------------------------ names
    def machine_pid(self, host: str) -> int:
        "Process id of the process that holds `host`'s namespaces (alive from start to stop)."
        p = self.procs.get(f"machine-{self._check_host(host)}")
        if p is None or p.poll() is not None: raise RuntimeError(f"host {host} is not running (stopped?)")
        return p.pid

    def _check_host(self, host: str) -> str:
        if host not in self.hosts: raise ValueError(f"host {host!r}: this cluster has {', '.join(self.hosts)}")
        return host

    def env(self, **extra) -> dict:
        "The environment for this cluster's Slurm clients: SLURM_CONF set, no outer job's or launcher's variables."
        drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in drop}
        return dict(env, SLURM_CONF=str(self.conf), **extra)

    # ------------------------------------------------------------ processes
    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.stdout", "a")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def _wait(self, what: str, ok, timeout: float, watch=None):
        "Poll `ok()` until true; fail early when a daemon in `watch` (default: all) has exited."
        end = time.monotonic() + timeout
        # every 0.25 s at first, then less often, up to once a second: a poll is often a Slurm client (a process),
        # and jobs wait minutes (Slurm's hold after a requeue, a hung rank's timeout) on a machine of 2 cores
        pause = 0.25
        while time.monotonic() < end:
            for name in (self.procs if watch is None else watch):
                p = self.procs.get(name)
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}:\n"
                                       f"{self.logs()}")
            if ok(): return
            time.sleep(pause)
            pause = min(pause * 1.5, 1.0)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}:\n{self.logs()}")

    def wait_until(self, what: str, ok, timeout: float):
        "Poll `ok()` until it is true (a RuntimeError naming `what` after `timeout` s, or when slurmctld exits)."
        self._wait(what, ok, timeout, watch=["slurmctld"])

    def logs(self, n: int = 20) -> str:
        "The last lines of every daemon log (for error messages)."
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)

    def _ip(self, *args, check: bool = True):
        p = subprocess.run(["ip", *args], capture_output=True, text=True)
        if check and p.returncode: raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
        return p

    # ------------------------------------------------------------ start
    def _enter(self, host: str, cwd=None) -> list[str]:
        "The nsenter prefix that runs a command in `host`'s network, UTS and mount namespaces."
        return ["nsenter", f"--target={self.machine_pid(host)}", "--net", "--uts", "--mount",
                f"--wd={cwd or self.root}"]

    def _in_host(self, host: str, *argv):
        p = subprocess.run([*self._enter(host), *argv], capture_output=True, text=True)
        if p.returncode: raise RuntimeError(f"on {host}: {' '.join(argv)}: {p.stderr.strip()}")

    def _make_network(self):
        "The bridge (root namespace, address .1 = ctl), and per host a machine process and a veth pair."
        if self._ip("link", "show", self.bridge, check=False).returncode == 0:
            raise RuntimeError(f"a link {self.bridge} exists already: another cluster uses tag {self.tag!r}; "
                               "pick another tag or stop that cluster")
        self.net = _pick_subnet(self.tag)
        self.addresses = {h: f"{self.net}.{10 + i}" for i, h in enumerate(self.hosts, start=1)}
        lines = ["127.0.0.1 localhost", f"{self.net}.1 ctl"] + [f"{a} {h}" for h, a in self.addresses.items()]
        hosts_file = self.root / "hosts"
        hosts_file.write_text("\n".join(lines) + "\n")
        self._ip("link", "add", "name", self.bridge, "type", "bridge")
        self.links.append(self.bridge)
        self._ip("addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for i, h in enumerate(self.hosts, start=1):
            # the machine: new network, UTS (hostname) and private mount (/etc/hosts) namespaces, then sleep.
            # unshare and sh exec the next program, so the process id is the namespaces' holder itself.
            ready = self.root / "run" / f"{h}.ready"
            inner = (f"hostname {h} && mount --bind {shlex.quote(str(hosts_file))} /etc/hosts && "
                     f"touch {shlex.quote(str(ready))} && exec sleep infinity")
            self._spawn(f"machine-{h}", ["unshare", "--net", "--uts", "--mount", "--propagation", "private",
                                         "sh", "-c", inner])
            self._wait(f"host {h}'s namespaces", ready.exists, 15, watch=[f"machine-{h}"])
            pid = self.machine_pid(h)
            self.host_ns[h] = os.readlink(f"/proc/{pid}/ns/net")
            veth = f"{self.tag}v{i}"
            self._ip("link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", str(pid))
            self.links.append(veth)
            self._ip("link", "set", veth, "master", self.bridge)
            self._ip("link", "set", veth, "up")
            self._in_host(h, "ip", "addr", "add", f"{self.addresses[h]}/24", "dev", "eth0")
            self._in_host(h, "ip", "link", "set", "eth0", "up")
            self._in_host(h, "ip", "link", "set", "lo", "up")

    def _start_slurmd(self, host: str):
        "slurmd of `host`, in the host's namespaces."
        # nsenter, not `ip netns exec` (that remounts /sys and slurmd then cannot find /sys/fs/cgroup). nsenter
        # execs slurmd, so the process id is slurmd's own.
        self._spawn(f"slurmd-{host}", [*self._enter(host), slurm_local.BINARIES["slurmd"], "-D", "-N", host,
                                       "-f", str(self.conf)])

    def start(self, timeout: float = 60):
        "Make the network, write config and key, start munged, slurmctld and the slurmds; return when all idle."
        r = self.root
        old = r / "state" / "clustername"
        if old.exists() and old.read_text().strip() != self.tag:
            raise RuntimeError(f"{r} holds the state of cluster {old.read_text().strip()!r}: start cluster "
                               f"{self.tag!r} in an empty folder (or remove {r / 'state'})")
        for d in ("state", "spool", "log", "munge", "run"): (r / d).mkdir(parents=True, exist_ok=True)
        for h in self.hosts: (r / "spool" / h).mkdir(exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        subprocess.run([slurm_local.BINARIES["mungekey"], "--create", "--force", f"--keyfile={key}"], check=True)
        os.chmod(key, 0o600)
        sock = r / "munge" / "munge.sock"
        self._spawn("munged", [slurm_local.BINARIES["munged"], "--foreground", "--force", f"--socket={sock}",
                               f"--key-file={key}", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed"])
        self._wait("the munge socket", sock.exists, 15)
        self._make_network()
        lo = slurm_local.free_port()
        nodes = "\n".join(f"NodeName={h} NodeAddr={a} CPUs={self.cpus_per_host} RealMemory=4000 State=UNKNOWN"
                          for h, a in self.addresses.items())
        self.conf = r / "slurm.conf"
        self.conf.write_text(CONF.format(n=len(self.hosts), tag=self.tag, net=self.net, root=r,
                                         cred_expire=CRED_EXPIRE,
                                         ctld_port=slurm_local.free_port(), slurmd_port=SLURMD_PORT,
                                         srun_lo=lo, srun_hi=lo + 50 if lo + 50 < 65535 else lo,
                                         slurmd_timeout=self.slurmd_timeout, nodes=nodes))
        # slurmctld must see its own name as SlurmctldHost: a UTS namespace whose hostname is ctl
        self._spawn("slurmctld", ["unshare", "--uts", "sh", "-c", f"hostname ctl && exec "
                                  f"{slurm_local.BINARIES['slurmctld']} -D -i -f {shlex.quote(str(self.conf))}"])
        for h in self.hosts: self._start_slurmd(h)
        self.wait_nodes(self.hosts, ("idle",), timeout)
        return self

    # ------------------------------------------------------------ clients
    def client(self, *args, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        "Run a Slurm client of this cluster (sinfo, squeue, scontrol, scancel ...) from the root namespace."
        p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=self.env(), timeout=timeout)
        if check and p.returncode:
            raise RuntimeError(f"{' '.join(map(str, args))} failed ({p.returncode}): {p.stderr}")
        return p

    def node_states(self) -> dict[str, str]:
        "Each host's state as sinfo shows it (idle, alloc, mix, down*, ...)."
        p = self.client("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return dict(line.split() for line in p.stdout.splitlines() if line.strip())

    def wait_nodes(self, hosts, states=("idle",), timeout: float = 60):
        "Wait until every host in `hosts` is in one of `states`."
        self._wait(f"{', '.join(hosts)} to be {'/'.join(states)} in sinfo",
                   lambda: all(self.node_states().get(h) in states for h in hosts), timeout, watch=["slurmctld"])

    def submit(self, script: str, *flags, name: str = "job") -> str:
        "sbatch the bash `script` text with `flags`; the job id. Output goes to ROOT/jobs/NAME-JOBID.out."
        jobs = self.root / "jobs"
        jobs.mkdir(exist_ok=True)
        p = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--output={jobs}/{name}-%j.out",
                            f"--chdir={jobs}", *map(str, flags)],
                           input=script, capture_output=True, text=True, env=self.env(), timeout=60)
        if p.returncode: raise RuntimeError(f"sbatch failed ({p.returncode}): {p.stderr}")
        return p.stdout.strip().split(";")[0]

    def output(self, job: str, name: str = "job") -> str:
        "The batch output file of `job` (submitted by `submit` under `name`)."
        f = self.root / "jobs" / f"{name}-{job}.out"
        return f.read_text(errors="replace") if f.exists() else ""

    def job(self, job: str) -> dict:
        "`scontrol show job -o` of `job` as a dict (JobState, Restarts, NodeList, ExitCode, ...)."
        return parse_fields(self.client("scontrol", "show", "job", "-o", job).stdout.strip())

    def wait_job(self, job: str, until=None, timeout: float = 300) -> dict:
        "Wait until `until(info)` (default: the job has ended); the job's scontrol fields."
        ended = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                 "DEADLINE", "PREEMPTED"}
        until = until or (lambda info: info.get("JobState") in ended)
        seen = [{}]
        def done():
            seen[0] = self.job(job)
            return until(seen[0])
        try: self._wait(f"job {job}", done, timeout, watch=["slurmctld"])
        except RuntimeError as e:
            raise RuntimeError(f"{e}\nlast seen: {seen[0]}") from None
        return seen[0]

    # ------------------------------------------------------------ hosts
    def slurmd_pid(self, host: str) -> int:
        "Process id of the host's running slurmd (a host whose processes were killed has none)."
        p = self.procs.get(f"slurmd-{self._check_host(host)}")
        if p is None or p.poll() is not None:
            raise RuntimeError(f"host {host} has no running slurmd (killed?): restart_slurmd('{host}') first")
        return p.pid

    def on_host(self, host: str, cmd, **kw) -> subprocess.CompletedProcess:
        "Run `cmd` (argv list or shell string) on `host`: in its network, UTS and mount namespaces."
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("env", self.env())
        enter = self._enter(host, kw.pop("cwd", os.getcwd()))
        return subprocess.run([*enter, *argv], **kw)

    def _pids_in(self, ns: str) -> list[int]:
        "Process ids of every process in network namespace `ns` (\"net:[inode]\")."
        pids = []
        for d in os.listdir("/proc"):
            if not d.isdigit(): continue
            try:
                if os.readlink(f"/proc/{d}/ns/net") == ns: pids.append(int(d))
            except OSError: continue          # exited meanwhile, or a process we may not inspect
        return pids

    def host_pids(self, host: str) -> list[int]:
        "Process ids of everything running on `host` (its network namespace), but the machine process itself."
        machine = self.procs.get(f"machine-{self._check_host(host)}")
        return [p for p in self._pids_in(self.host_ns[host]) if machine is None or p != machine.pid]

    def kill_host(self, host: str, timeout: float = 15):
        "Simulate the death of `host`: SIGKILL every process on it (slurmd, slurmstepd, the job's processes)."
        for pid in self.host_pids(host):
            try: os.kill(pid, 9)
            except ProcessLookupError: pass
        p = self.procs.get(f"slurmd-{host}")
        if p is not None:
            try: p.wait(timeout)
            except subprocess.TimeoutExpired: raise RuntimeError(f"slurmd of {host} survived SIGKILL") from None
        self._wait(f"every process of {host} to exit", lambda: not self.host_pids(host), timeout, watch=[])

    def restart_slurmd(self, host: str, timeout: float = 60, states=("idle", "mix", "alloc")):
        "Start `host`'s slurmd again (after kill_host); return when slurmctld shows it up (by default)."
        p = self.procs.get(f"slurmd-{self._check_host(host)}")
        if p is not None and p.poll() is None: raise RuntimeError(f"slurmd of {host} is still running")
        self._start_slurmd(host)
        if states: self.wait_nodes([host], states, timeout)

    # ------------------------------------------------------------ stop
    def stop(self):
        "Cancel the jobs, stop the daemons started here (by pid), kill what is left on the hosts, remove the links."
        ctld = self.procs.get("slurmctld")
        if self.conf is not None and ctld is not None and ctld.poll() is None:
            self.client("scancel", "--full", "--user", str(os.getuid()), check=False)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.client("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.3)
        def end(p: subprocess.Popen, sig: str):
            if p.poll() is None:
                p.terminate() if sig == "TERM" else p.kill()
                try: p.wait(15)
                except subprocess.TimeoutExpired: p.kill(); p.wait()
        for name in [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
            if name in self.procs: end(self.procs[name], "TERM")
        for h in self.host_ns:                   # what jobs left behind on the hosts (not the machines)
            for pid in self.host_pids(h):
                try: os.kill(pid, 9)
                except ProcessLookupError: pass
        for link in reversed(self.links): self._ip("link", "del", link, check=False)
        self.links.clear()
        for name in [n for n in self.procs if n.startswith("machine-")]: end(self.procs[name], "KILL")

    def leftovers(self) -> list[str]:
        "What of this cluster still exists (links, live processes, processes on its hosts): empty after stop()."
        links = self._ip("-o", "link", "show", check=False).stdout
        left = [f"link {m}" for m in re.findall(rf"^\d+: ({self.tag}(?:br|v\d+))[@:]", links, re.M)]
        left += [f"process {n} ({p.pid})" for n, p in self.procs.items() if p.poll() is None]
        left += [f"process {pid} on {h}" for h, ns in self.host_ns.items() for pid in self._pids_in(ns)]
        return left

def start(root, hosts: int = 2, tag: str | None = None, log=print, **kw) -> MultiHostSlurm:
    "Install Slurm when needed and start a private cluster of `hosts` namespace hosts under `root`."
    slurm_local.install(log)
    c = MultiHostSlurm(root, hosts, tag, **kw)
    try: return c.start()
    except BaseException:
        c.stop(); raise

if __name__ == "__main__":  # manual check: python tests/multihost.py /tmp/mh-try 2
    import sys
    root, hosts = (sys.argv[1:] + ["/tmp/mtnlg-multihost", "2"][len(sys.argv) - 1:])[:2]
    c = start(root, int(hosts))
    try:
        print(c.client("sinfo", "-N").stdout)
        j = c.submit("#!/bin/bash\nsrun bash -c 'echo $(hostname) $(hostname -I)'\n", "-N", str(len(c.hosts)))
        print(c.wait_job(j)["JobState"], c.output(j), sep="\n")
    finally:
        c.stop()
        print("left behind:", c.leftovers() or "nothing")
