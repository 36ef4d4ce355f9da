"""The multi-host group's work: the seconds of set-up, call and tear-down of each test of the three files that share
the multi-host Slurm cluster (tests/test_hosts.py, tests/test_multihost.py, tests/test_curation_hosts.py), as
`pytest --durations=0` prints them, summed per test and in all; written to a JSON file.

    python benchmarks/multihost_group.py multihost_group_after.json                # run the group alone now
    python benchmarks/multihost_group.py multihost_group_before.json --log OUT.txt  # read a run's saved output
"""
import argparse, json, os, re, subprocess, sys, time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/test_hosts.py", "tests/test_multihost.py", "tests/test_curation_hosts.py"]
LINE = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)$")

def durations(text: str) -> dict:
    "{test id: {setup, call, teardown seconds}} from pytest's --durations=0 lines."
    per = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m: per.setdefault(m.group(3), {})[m.group(2)] = float(m.group(1))
    return per

def main():
    ap = argparse.ArgumentParser(description="Seconds of each test of the multi-host group, into a JSON file.")
    ap.add_argument("out", help="the JSON file to write, under benchmarks/")
    ap.add_argument("--log", help="a saved output of the same pytest command (else the group runs now)")
    ap.add_argument("--note", default="", help="how the run was made (the machine's load, the commit)")
    a = ap.parse_args()
    cmd = [sys.executable, "-m", "pytest", *FILES, "--durations=0", "-p", "no:cacheprovider"]
    if a.log: text = Path(a.log).read_text()
    else:
        text = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    per = durations(text)
    summary = [l for l in text.splitlines() if re.search(r"\b(passed|failed)\b.* in [\d.]+s", l)]
    tests = {t: dict(d, total=round(sum(d.values()), 2)) for t, d in per.items()}
    record = {"command": " ".join(cmd[1:]), "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "cores": os.cpu_count(), "load_1min_at_end": None if a.log else os.getloadavg()[0], "summary": summary[-1] if summary else "", "note": a.note,
              "work_s": round(sum(d["total"] for d in tests.values()), 1),
              "tests": dict(sorted(tests.items(), key=lambda kv: -kv[1]["total"]))}
    Path(ROOT / "benchmarks" / a.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"work {record['work_s']} s over {len(tests)} tests ({record['summary']}) -> benchmarks/{a.out}")

if __name__ == "__main__": main()
