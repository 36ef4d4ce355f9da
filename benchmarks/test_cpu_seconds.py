"""CPU seconds (user + system, the command and every process it waited for) and wall seconds of commands run side by
side, so a shared machine's load weighs on each alike: for a test file before and after a change, where wall time
on a loaded machine says little. Writes the JSON named first.

    python benchmarks/test_cpu_seconds.py OUT.json before "pytest tests/old.py" after "pytest tests/new.py"
"""
import json, resource, shlex, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def measured(cmd: str) -> dict:
    "Run `cmd` in a process of its own (a python that waits for it): its CPU and wall seconds, exit code, last line."
    code = ("import resource, subprocess, sys, time, json; t = time.time(); "
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print(json.dumps(dict(cpu_s=round(u.ru_utime + u.ru_stime, 1), wall_s=round(time.time() - t, 1), "
            "rc=p.returncode, last=(p.stdout.strip().splitlines() or [''])[-1])))")
    p = subprocess.run([sys.executable, "-c", code, *shlex.split(cmd)], capture_output=True, text=True)
    return dict(json.loads(p.stdout.strip().splitlines()[-1]), cmd=cmd)


if __name__ == "__main__":
    out, pairs = sys.argv[1], sys.argv[2:]
    names, cmds = pairs[::2], pairs[1::2]
    t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with ThreadPoolExecutor(len(cmds)) as ex: got = dict(zip(names, ex.map(measured, cmds)))
    load = Path("/proc/loadavg").read_text().split()[:3]
    Path(out).write_text(json.dumps(dict(started=t0, loadavg_at_end=load, runs=got), indent=1) + "\n")
    print(json.dumps(got, indent=1))
