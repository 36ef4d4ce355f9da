"""Seconds per test file and per test (set-up + call + teardown) from pytest's `--durations=0` report, for runs of the
same files before and after a change; each run's summary line kept. Writes the JSON named last.

    python benchmarks/test_durations.py before.txt after.txt benchmarks/test_durations_genshare.json
"""
import json, re, sys
from collections import Counter
from pathlib import Path

LINE = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(tests/\S+?\.py)::(\S.*)$")


def durations(text: str) -> dict:
    "{'files': {file: s}, 'tests': {file::test: s}, 'summary': pytest's last line} of one run's output."
    files, tests = Counter(), Counter()
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m: continue
        s, _, f, t = m.groups()
        files[f] += float(s)
        tests[f"{f}::{t}"] += float(s)
    summary = [x for x in text.splitlines() if re.search(r"\d+ passed", x)]
    return dict(files={k: round(v, 2) for k, v in sorted(files.items())},
                tests={k: round(v, 2) for k, v in tests.most_common()},
                summary=summary[-1].strip("= ") if summary else "")


if __name__ == "__main__":
    *runs, out = sys.argv[1:]
    got = {Path(r).stem: durations(Path(r).read_text()) for r in runs}
    Path(out).write_text(json.dumps(got, indent=1) + "\n")
    for name, d in got.items(): print(name, d["summary"], d["files"])
