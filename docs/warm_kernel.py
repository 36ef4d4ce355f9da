"""Warm kernels for the suite's notebook runs (tests/test_notebooks.py): a zygote process imports ipykernel and torch
once, then forks a fresh kernel for each notebook, so each notebook pays neither the interpreter's start nor torch's
import (about 3 s of CPU a notebook here). Nothing a notebook does reaches another: each kernel is a new process
forked from the zygote, which never runs notebook code. What differs from a reader's kernel, and why it is safe:
- torch is in `sys.modules` before the first cell. Its import is checked silent in the zygote (no stdout, stderr or
  warning, else the zygote serves no kernel), so a notebook cannot hide an import-time message that way; it must
  leave one thread (a BLAS pool started before the fork would be missing in the kernel); the warning
  filters torch's import adds are dropped in each kernel (a kernel shows more warnings than a reader's, never fewer).
- The kernel's environment is the one the notebook was started with; a kernel whose environment differs from the
  zygote's (variables read when torch loads: threads, CPU paths) is refused and started the usual way instead.
Started by `WarmKernels` (a context manager); the kernel spec's command is this file's `client` mode, which asks the
zygote for a kernel and forwards signals to it, or execs `python -m ipykernel_launcher` when refused."""
from __future__ import annotations
import json, os, selectors, signal, socket, struct, subprocess, sys, tempfile, time
from pathlib import Path

SOCKET_ENV = "MTNLG_WARM_KERNEL_SOCKET"
PRELOAD = ("torch",)                 # imported once in the zygote: each kernel's largest import
PER_KERNEL = ("JPY_", "PYTEST_CURRENT_TEST", SOCKET_ENV)   # set per kernel or per test: not compared
KERNEL_NAME = "mtnlg-warm"

def _comparable(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith(PER_KERNEL)}

def _send(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    socket.send_fds(sock, [struct.pack("!I", len(data)) + data], list(fds))

def _recv(sock, nfds=0):
    "One message (and up to `nfds` file descriptors); None when the other side closed."
    head, fds, *_ = socket.recv_fds(sock, 4, nfds) if nfds else (sock.recv(4), [])
    while head and len(head) < 4: head += sock.recv(4 - len(head))
    if len(head) < 4: return (None, fds) if nfds else None
    size, body = struct.unpack("!I", head)[0], b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk: return (None, fds) if nfds else None
        body += chunk
    msg = json.loads(body)
    return (msg, fds) if nfds else msg

# --- the zygote ---------------------------------------------------------------------------------------------------
def _preload() -> tuple[list, str]:
    "Import ipykernel and PRELOAD with fds 1 and 2 captured; (warning filters before PRELOAD, what it printed)."
    import importlib, warnings
    import ipykernel.ipkernel, ipykernel.zmqshell, ipykernel.iostream   # noqa: F401  (the kernel's machinery; not
    # kernelapp, imported by each kernel: its traits' defaults read the kernel's environment, JPY_PARENT_PID)
    filters = list(warnings.filters)
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as cap:
        os.dup2(cap.fileno(), 1); os.dup2(cap.fileno(), 2)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for m in PRELOAD: importlib.import_module(m)
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os.dup2(saved[0], 1); os.dup2(saved[1], 2); os.close(saved[0]); os.close(saved[1])
        cap.seek(0)
        noise = cap.read().decode(errors="replace") + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
    assert "ipykernel.kernelapp" not in sys.modules, "the zygote imported ipykernel.kernelapp"
    return filters, noise

def _kernel(msg: dict, fds: list, filters: list):
    "In the forked child: become `python -m ipykernel_launcher -f CONNECTION_FILE` started in msg's cwd and env."
    import runpy, warnings
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    for i, fd in enumerate(fds[:3]): os.dup2(fd, i)
    for fd in fds: os.close(fd)
    os.chdir(msg["cwd"])
    os.environ.clear(); os.environ.update({k: v for k, v in msg["env"].items() if k != SOCKET_ENV})
    warnings.filters[:] = filters; warnings._filters_mutated()
    if "numpy" in sys.modules: sys.modules["numpy"].random.seed()    # numpy's global state: fresh, as a new process
    sys.argv = ["ipykernel_launcher", "-f", msg["connection_file"], *msg.get("extra", [])]
    sys.path[0] = msg["cwd"]                                          # `python -m` puts the cwd first
    code = 0
    try: runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    except SystemExit as e: code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException: import traceback; traceback.print_exc(); code = 1
    finally:
        try: sys.stdout.flush(); sys.stderr.flush()
        except Exception: pass
    os._exit(code)

def _threads() -> int:
    "This process's threads (a fork copies only the one that forks)."
    try: return len(os.listdir("/proc/self/task"))
    except FileNotFoundError: import threading; return threading.active_count()

def _unfit(noise: str, threads: int) -> str | None:
    "Why the zygote may not serve: torch's import printed something, or it left threads a fork would not copy."
    if noise: return f"torch's import printed: {noise[-300:]}"
    if threads > 1: return f"{threads} threads after torch's import (a fork keeps one): set OMP_NUM_THREADS=1"
    return None

def serve(path: str):
    "The zygote: preload, say whether it may serve (ready, else why not), then fork one kernel per request."
    filters, noise = _preload()
    unfit = _unfit(noise, _threads())
    env = _comparable(dict(os.environ))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path); listener.listen(16)
    print(json.dumps({"ready": unfit is None, "why": unfit, "noise": noise[-2000:]}), flush=True)
    sel, kids = selectors.DefaultSelector(), {}          # kids: pid -> the client's connection
    sel.register(listener, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)        # closed by WarmKernels: the zygote ends
    while True:
        for key, _ in sel.select(timeout=0.2):
            if key.fileobj is sys.stdin:
                if not sys.stdin.readline():
                    for pid in kids: os.killpg(pid, signal.SIGKILL)
                    return
            elif key.fileobj is listener:
                conn, _ = listener.accept()
                msg, fds = _recv(conn, 3)
                why = None if msg is None else unfit
                if msg is not None and why is None and _comparable(msg["env"]) != env:
                    a, b = _comparable(msg["env"]), env
                    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                    why = "environment differs: " + ", ".join(differ)
                if msg is None or why:
                    for fd in fds: os.close(fd)
                    if msg is not None: _send(conn, {"refused": why})
                    conn.close(); continue
                pid = os.fork()
                if pid == 0:
                    listener.close(); conn.close(); sel.close()
                    _kernel(msg, fds, filters)
                for fd in fds: os.close(fd)
                _send(conn, {"pid": pid})
                kids[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            else:                                        # a client closed (killed): its kernel goes with it
                pid = key.data
                try: os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError: pass
        for pid, conn in list(kids.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done: continue
            try: _send(conn, {"status": status})
            except OSError: pass
            sel.unregister(conn); conn.close(); del kids[pid]

# --- the kernel spec's command ------------------------------------------------------------------------------------
def client(connection_file: str, extra: list[str]):
    "A kernel from the zygote (signals forwarded, its exit status returned), or a fresh one when refused."
    fresh = [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file, *extra]
    env = dict(os.environ)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(env[SOCKET_ENV])
        _send(sock, {"connection_file": connection_file, "extra": extra, "cwd": os.getcwd(), "env": env}, (0, 1, 2))
        reply = _recv(sock)
    except (OSError, KeyError) as e: reply = {"refused": f"no zygote ({e})"}
    if not reply or "refused" in reply:
        print(f"[warm kernel] a fresh kernel: {reply and reply['refused']}", file=sys.stderr, flush=True)
        os.environ.pop(SOCKET_ENV, None)
        os.execv(sys.executable, fresh)
    pid = reply["pid"]
    def forward(sig, _):
        try: os.kill(pid, sig)
        except ProcessLookupError: pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    msg = _recv(sock)
    status = msg["status"] if msg else 1 << 8
    sys.exit(os.waitstatus_to_exitcode(status) % 256 if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))

# --- the suite's side ---------------------------------------------------------------------------------------------
class WarmKernels:
    """The zygote and a kernel spec (KERNEL_NAME) whose kernels it forks; `kernel_manager_class` for NotebookClient.
    `env`: the kernels' environment (a notebook started with another gets a fresh kernel)."""
    def __init__(self, env: dict):
        self.name, self.dir = KERNEL_NAME, Path(tempfile.mkdtemp(prefix="mtnlg-warm-"))
        sock = str(self.dir / "zygote.sock")
        spec = self.dir / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, str(Path(__file__).resolve()), "client", "{connection_file}"],
            "display_name": "Python 3 (ipykernel, forked from a warm zygote)", "language": "python",
            "env": {SOCKET_ENV: sock}, "interrupt_mode": "signal", "metadata": {"debugger": True}}))
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", sock], env=env,
                                     cwd=str(self.dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        status = json.loads(self.proc.stdout.readline() or '{"ready": false, "why": "the zygote did not start"}')
        self.ready, self.why = status["ready"], status["why"]
        from jupyter_client import AsyncKernelManager
        from jupyter_client.kernelspec import KernelSpecManager
        kernel_dirs = [str(self.dir / "kernels")]
        from traitlets import default
        class Manager(AsyncKernelManager):
            @default("kernel_spec_manager")
            def _kernel_spec_manager_default(self): return KernelSpecManager(kernel_dirs=kernel_dirs)
        self.kernel_manager_class = Manager

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try: self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired: self.proc.kill(); self.proc.wait()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self): return self
    def __exit__(self, *a): self.close()

if __name__ == "__main__":
    if sys.argv[1] == "serve": serve(sys.argv[2])
    elif sys.argv[1] == "client": client(sys.argv[2], sys.argv[3:])
