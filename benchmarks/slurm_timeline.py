"""What a Slurm cluster of the test suite ran, and when: `squeue` every 3 s while the cluster's slurm.conf exists
(`sample`), then each job's spans of one state (RUNNING, PENDING and its reason) from that log (`spans`, JSON).

    python benchmarks/slurm_timeline.py sample /tmp/mtnlg-pytest-XXXX/multihost2-0/slurm.conf squeue.log
    python benchmarks/slurm_timeline.py spans squeue.log slurm_timeline_after.json --note "..."
"""
import argparse, json, os, subprocess, time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def sample(conf: Path, out: Path, every: float = 3.0):
    "Append `HH:MM:SS job:name:state:reason:nodes ...` lines while `conf` exists (the cluster runs)."
    env = dict(os.environ, SLURM_CONF=str(conf))
    with open(out, "a") as f:
        while conf.exists():
            q = subprocess.run(["squeue", "-h", "-o", "%i:%j:%T:%r:%N"], capture_output=True, text=True, env=env,
                               timeout=10)
            f.write(f"{time.strftime('%H:%M:%S', time.gmtime())} {' '.join(q.stdout.split())}\n")
            f.flush()
            time.sleep(every)

def spans(log: Path) -> list[dict]:
    "Each job's consecutive samples of one state and reason: job, name, state, start, end, seconds (sampled)."
    seconds = lambda t: (datetime.strptime(t, "%H:%M:%S") - datetime(1900, 1, 1)).total_seconds()
    open_, done = {}, []
    for line in log.read_text().splitlines():
        t, *jobs = line.split()
        now, seen = seconds(t), {}
        for j in jobs:
            job, name, state, reason = j.split(":")[:4]
            seen[job] = (name, state if state != "PENDING" else f"PENDING({reason})")
        for job in list(open_):
            if open_[job]["key"] != seen.get(job):
                done.append(dict(open_.pop(job), end=t))
        for job, key in seen.items():
            if job not in open_: open_[job] = dict(key=key, job=job, name=key[0], state=key[1], start=t, t0=now)
        for s in open_.values(): s["last"] = now
    done += [dict(s, end="(end)") for s in open_.values()]
    for s in done:
        s["seconds"] = round(seconds(s["end"]) - s["t0"] if s["end"] != "(end)" else s["last"] - s["t0"])
        for k in ("key", "t0", "last"): s.pop(k, None)
    return sorted(done, key=lambda s: s["start"])

def main():
    ap = argparse.ArgumentParser(description="A test cluster's jobs over time: sample squeue, or read the samples.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="squeue every 3 s into a log while the cluster runs")
    s.add_argument("conf", type=Path, help="the cluster's slurm.conf")
    s.add_argument("log", type=Path, help="the log to append to")
    r = sub.add_parser("spans", help="each job's spans of one state from a sampled log, into a JSON file")
    r.add_argument("log", type=Path, help="a log written by `sample`")
    r.add_argument("out", help="the JSON file to write, under benchmarks/")
    r.add_argument("--note", default="", help="how the run was made (the commit, the machine's load)")
    a = ap.parse_args()
    if a.cmd == "sample": return sample(a.conf, a.log)
    record = dict(note=a.note, spans=spans(a.log))
    (ROOT / "benchmarks" / a.out).write_text(json.dumps(record, indent=1) + "\n")
    for x in record["spans"]: print(f"{x['start']}-{x['end']} {x['seconds']:>4} s  {x['job']} {x['name']} {x['state']}")

if __name__ == "__main__": main()
