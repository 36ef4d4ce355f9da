"""No rank dies because another works alone, and a hung rank ends the job fast, naming itself (mtnlg.topology's
heartbeat and long group), with the group timeout (`timeout_s`) shortened to seconds.

- Two ranks whose rank 0 works alone until a plain wait beside rank 1's has timed out: `from_leader` and
  `broadcast_waiting` finish; the same wait in a plain collective (`monitored=False`, what every wait was before)
  with the same timeout times out (the control, run beside each case; an event ends rank 0's work, not a time).
- A study's `Session` at TP2 left idle for 1.5 x its run's timeout still answers; its key is in the ranks'
  environment, on no command line, and a connection without the key does not stop its start.
- A training rank stopped (SIGSTOP) in the middle of a step: the job ends with one line naming that rank and its
  host; `--resume` continues from the last complete checkpoint with the losses of an uninterrupted run.

Launches: one trained run (DP2, 4 steps), read by the session and as the stopped rank's reference; the stopped run and
its resume; the two-rank worker. The launches whose ranks mostly wait run in the background (tests/conftest.py's
order is the file's): the two-rank worker beside the trained run, the stopped run beside the idle session.
"""
import json, os, socket, subprocess, sys, threading, time
from pathlib import Path
import pytest
from conftest import ROOT, LAUNCHER_VARS, free_port_block
from mtnlg.train import read_metrics

pytestmark = pytest.mark.slow          # each test launches ranks
MTNLG = str(Path(sys.executable).parent / "mtnlg")


def env(**extra) -> dict:
    "This machine's environment without a launcher around it, one thread a rank."
    e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    return dict(e, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", **extra)


def tiny_train(out: Path, *flags, timeout_s: int = 20) -> list[str]:
    return [MTNLG, "train", "--preset", "tiny", "--data", "mock", "--global-batch", "8", "--precision", "fp32",
            "--timeout-s", str(timeout_s), "--no-progress", "--out", str(out), *map(str, flags)]


def tiny_run(out: Path, *flags, timeout_s: int = 20) -> subprocess.CompletedProcess:
    return subprocess.run(tiny_train(out, *flags, timeout_s=timeout_s), capture_output=True, text=True, env=env(),
                          timeout=900)


def background(cmd: list[str], logs: Path, **extra_env) -> subprocess.Popen:
    "`cmd` started, its output to LOGS/stdout.txt and LOGS/stderr.txt (a launch that mostly waits, beside others)."
    with open(logs / "stdout.txt", "w") as o, open(logs / "stderr.txt", "w") as e:
        return subprocess.Popen(cmd, stdout=o, stderr=e, text=True, env=env(**extra_env))


def end_unfinished(p: subprocess.Popen):
    "Teardown of a background launch whose test did not run: torchrun stops its ranks."
    if p.poll() is None:
        p.terminate()
        p.wait(timeout=120)


def beside(request, name: str):
    "Start module fixture `name` (a background launch) now, when a selected test uses it."
    if any(name in t.fixturenames for t in request.session.items): request.getfixturevalue(name)


def rank_processes(run) -> dict[int, tuple[str, str]]:
    "{pid: (command line, environment)} of the processes that run `mtnlg.session` ranks over run folder `run`."
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit(): continue
        try: cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError: continue
        if "mtnlg.session" in cmd and str(run) in cmd:      # not another test's session beside this one
            try: found[int(d.name)] = (cmd, (d / "environ").read_bytes().decode(errors="replace"))
            except OSError: pass
    return found


def every_command_line() -> str:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try: out.append((d / "cmdline").read_bytes().decode(errors="replace"))
            except OSError: pass
    return "\n".join(out)


def stranger(run, seen: dict, stop: threading.Event):
    "Connect to the session's listener without its key as soon as its ranks show their address (as anyone could)."
    from multiprocessing.connection import Client
    while not stop.is_set():
        for cmd, _ in rank_processes(run).values():
            if "--address" in cmd:
                host, port = cmd.split("--address ")[1].split()[0].rsplit(":", 1)
                try:
                    with Client((host, int(port)), authkey=b"not the key"): seen["connected"] = True
                except Exception as e: seen["refused"] = f"{type(e).__name__}: {e}"
                return
        time.sleep(0.05)


FLAGS = ["--dp", 2, "--steps", 4, "--save-interval", 1]
TIMEOUT_S = 20


@pytest.fixture(scope="module")
def ref(tmp_path_factory, request) -> Path:
    "One trained run (DP2, 4 steps, saved each step): the idle session's model and the stopped run's reference."
    beside(request, "alone")                              # started first: its ranks wait while this run trains
    run = tmp_path_factory.mktemp("alive") / "ref"
    p = tiny_run(run, *FLAGS, timeout_s=TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def stopped(ref, tmp_path_factory) -> tuple[subprocess.Popen, Path]:
    "The run whose rank 1 stops itself inside step 3 (DP2, saved each step), started after `ref`: (process, run)."
    logs = tmp_path_factory.mktemp("stopped")
    p = background(tiny_train(logs / "hung", *FLAGS, timeout_s=TIMEOUT_S), logs, MTNLG_INJECT_HANG="3:1")
    yield p, logs / "hung"
    end_unfinished(p)


def test_an_idle_session_still_answers_and_its_key_stays_off_command_lines(ref, request):
    from mtnlg.session import KEY_ENV, Session
    beside(request, "stopped")                            # the stopped run trains and hangs beside the idle session
    seen, stop = {}, threading.Event()
    t = threading.Thread(target=stranger, args=(ref, seen, stop), daemon=True)
    t.start()
    try:
        with Session(ref, tp=2) as s:
            stop.set()
            assert s._ranks.listener.address[0] == "127.0.0.1"                 # every rank runs here
            ranks = rank_processes(ref)
            keys = {e.split(f"{KEY_ENV}=")[1].split("\0")[0] for _, e in ranks.values() if KEY_ENV in e}
            assert len(keys) == 1 and len(next(iter(keys))) == 64, "the ranks hold the session's key"
            assert next(iter(keys)) not in every_command_line()                # but no command line shows it
            first = s.score_pairs([("The cat sat on the", " mat")])
            time.sleep(1.5 * TIMEOUT_S)                 # the notebook idles, past the run's group timeout
            again = s.score_pairs([("The cat sat on the", " mat")])
    finally:
        stop.set()
    assert "refused" in seen and "connected" not in seen, seen              # the stranger was turned away
    assert again == first and len(again) == 1


def test_a_stopped_rank_ends_training_naming_itself_and_resume_matches(ref, stopped):
    # rank 1 stops itself inside step 3's loss: steps 1-2 are checkpointed, rank 0 waits in the step's all-reduce
    p, run = stopped
    assert p.wait(timeout=900) != 0
    stderr = (run.parent / "stderr.txt").read_text()
    said = [l for l in stderr.splitlines() if "has not answered for" in l]
    assert said and said[0].startswith(f"mtnlg: rank 1 on host {socket.gethostname()} has not answered"), \
        said or stderr[-4000:]
    assert "the last complete checkpoint is step00000002" in stderr, stderr[-3000:]
    assert (run / "hung.txt").read_text().startswith("rank 1 on host")   # for a job that requeues
    assert "Timed out waiting" not in stderr               # the heartbeat ended it, before any collective's timeout
    # the resume with a group timeout a loaded machine's start fits in (its ranks' imports may end 20 s apart)
    again = subprocess.run([MTNLG, "train", "--out", str(run), "--resume", "--timeout-s", "300", "--no-progress"],
                           capture_output=True, text=True, env=env(), timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    got = {r["step"]: r["loss"] for r in read_metrics(run)}
    want = {r["step"]: r["loss"] for r in read_metrics(ref)}
    assert sorted(got) == [1, 2, 3, 4] and all(abs(got[s] - want[s]) < 1e-6 for s in got), (got, want)


ALONE_TIMEOUT_S = 15     # a heartbeat silent for half of it counts as hung: 7.5 s is far from scheduling delays


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The two-rank worker (tests/alive_worker.py), started in the background: its ranks mostly wait (for a timeout,
    then for each other), so the module's trained run goes on beside them. (process, its output folder)."""
    out = tmp_path_factory.mktemp("alone")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port_block(1)), str(ROOT / "tests" / "alive_worker.py"), str(out), str(ALONE_TIMEOUT_S)]
    p = background(cmd, out)
    yield p, out
    end_unfinished(p)


def test_a_rank_working_alone_past_the_timeout_is_waited_for(alone):
    p, out = alone
    assert p.wait(timeout=600) == 0, (out / "stderr.txt").read_text()[-4000:]
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    # rank 0 worked alone until a plain wait beside rank 1's timed out: rank 1 waited on and got its value
    assert r0["from_leader"] == r1["from_leader"] == {"from": 0, "value": 42}
    assert r0["broadcast_waiting"] == r1["broadcast_waiting"] == [7, 8, 9]
    # the controls: the same wait in a plain collective (a spare group; the process group's own) timed out meanwhile
    for control in ("plain_spare", "plain"):
        assert f"Timed out waiting {ALONE_TIMEOUT_S * 1000}ms" in r1[control]["error"], r1[control]
