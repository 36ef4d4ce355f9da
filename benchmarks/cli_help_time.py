"""`mtnlg COMMAND --help` time: each command's help, against importing the module that runs it (what --help cost
when the parser was built by importing that module). CPU seconds (user + sys) are the figure that holds on a loaded
machine; wall seconds are shown too. Best of --repeat runs, in fresh processes.

    .venv/bin/python benchmarks/cli_help_time.py [--repeat 3] [--out benchmarks/cli_help_time.json]
"""
import argparse, json, resource, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP = "import sys; from mtnlg.cli import main; sys.exit(main(sys.argv[1:]))"
COMMANDS = {"train": "mtnlg.train", "eval": "mtnlg.eval", "generate": "mtnlg.generate", "export": "mtnlg.export",
            "data curate": "mtnlg.corpus", "demo": "mtnlg.demo", "plan": "mtnlg.dryrun", "job submit": "mtnlg.jobs"}


def timed(cmd: list, repeat: int) -> dict:
    "Best wall and CPU seconds of `repeat` runs of `cmd` (a fresh process each)."
    walls, cpus = [], []
    for _ in range(repeat):
        before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(time.perf_counter() - t)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return dict(wall_s=round(min(walls), 3), cpu_s=round(min(cpus), 3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, the best kept (default: 3)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "cli_help_time.json"), help="JSON to write")
    a = ap.parse_args()
    rows = {}
    for command, module in COMMANDS.items():
        rows[command] = dict(help=timed([sys.executable, "-c", HELP, *command.split(), "--help"], a.repeat),
                             import_module=timed([sys.executable, "-c", f"import {module}"], a.repeat))
        print(f"mtnlg {command} --help: {rows[command]['help']}; import {module}: {rows[command]['import_module']}",
              flush=True)
    Path(a.out).write_text(json.dumps(dict(rows=rows, load_average=list(__import__("os").getloadavg())), indent=1))


if __name__ == "__main__":
    main()
