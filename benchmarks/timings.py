"""The wall time of a command users run (`make demo`, `make test`...), recorded in benchmarks/timings.json: the one
figure the README and the notebooks quote for it (tests/test_docs.py checks every such claim against this file, and
that each figure is written in benchmarks/RESULTS.md, where its section says how it was measured).

    python benchmarks/timings.py demo -- make demo                       # time it now, record it
    python benchmarks/timings.py demo --seconds 482.3 --source "RESULTS.md: ..."   # a figure measured by hand

`make test`'s figure is pytest's own ("N passed in S s"), read from the command's output when it prints one.
"""
import argparse, json, os, platform, re, subprocess, sys, time
from datetime import datetime, timezone
from pathlib import Path

OUT = Path(__file__).with_name("timings.json")

def record(name: str, seconds: float, source: str, out: Path = OUT) -> dict:
    "Write `name`'s figure (seconds, where it was measured) into `out`, keeping the others; the whole record."
    data = json.loads(out.read_text()) if out.exists() else {}
    data[name] = {"seconds": round(seconds, 1), "source": source}
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data

def timed(cmd: list[str]) -> tuple[float, str]:
    "Run `cmd`, echoing its output; (seconds: pytest's own figure if it printed one, else the wall time, output)."
    t = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t
    sys.stdout.write(p.stdout)
    if p.returncode: sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): nothing recorded")
    m = re.findall(r"\b\d+ passed.* in ([\d.]+)s\b", p.stdout)
    return (float(m[-1]) if m else wall), p.stdout

def main():
    ap = argparse.ArgumentParser(description="Record the time of a command users run in benchmarks/timings.json.")
    ap.add_argument("name", help="the figure's name in timings.json: demo, demo_fresh, test, test_fast")
    ap.add_argument("--seconds", type=float, help="a figure measured by hand (then --source says where)")
    ap.add_argument("--source", default="", help="where the figure is written in RESULTS.md")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)          # after --: the command to time
    a, cmd = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if (a.seconds is None) == (not cmd): ap.error("give a command to time (after --) or --seconds, not both")
    seconds = a.seconds if a.seconds is not None else timed(cmd)[0]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = a.source or f"`{' '.join(cmd)}` on {when}, {os.cpu_count()} cores ({platform.machine()})"
    record(a.name, seconds, source)
    print(f"{a.name}: {seconds:.1f} s ({seconds / 60:.1f} min) -> {OUT}; write it in benchmarks/RESULTS.md too")

if __name__ == "__main__": main()
