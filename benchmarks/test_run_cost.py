"""One file's pytest runs before and after a change: seconds per test (`--durations=0`, as test_durations.py reads
them) and the CPU seconds and peak RSS of the run (`/usr/bin/time -v` around pytest: the command and every process
it waited for). Writes the JSON named last.

    /usr/bin/time -v python -m pytest tests/test_x.py --durations=0 > before.txt 2>&1   # the same for after.txt
    python benchmarks/test_run_cost.py before.txt after.txt benchmarks/test_run_cost_x.json
"""
import json, re, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from test_durations import durations


def time_v(text: str) -> dict:
    "CPU seconds (user + system), wall seconds and the largest process's peak RSS (MiB) from `/usr/bin/time -v`."
    def field(name):
        m = re.search(rf"^\s*{re.escape(name)}: (.+)$", text, re.M)
        return m.group(1).strip() if m else None
    wall = [float(x) for x in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    return dict(cpu_s=round(float(field("User time (seconds)")) + float(field("System time (seconds)")), 1),
                wall_s=round(sum(x * 60 ** i for i, x in enumerate(reversed(wall))), 1),
                max_rss_mib=round(int(field("Maximum resident set size (kbytes)")) / 1024))


if __name__ == "__main__":
    *runs, out = sys.argv[1:]
    got = {Path(r).stem: dict(durations(Path(r).read_text()), **time_v(Path(r).read_text())) for r in runs}
    Path(out).write_text(json.dumps(got, indent=1) + "\n")
    for name, d in got.items(): print(name, d["summary"], "cpu", d["cpu_s"], "wall", d["wall_s"])
