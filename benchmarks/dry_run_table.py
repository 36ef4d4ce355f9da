"""The planner against dry runs (`mtnlg.dryrun`) for the paper's presets, each at its own layout and two others (one
with recompute off, one with another TP x PP), on the first, a middle and the last pipeline stage, with the real
number of micro-batches a step: memory by category, bytes handed to each group in a step, checkpoint bytes.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dry_run_table.py [--out benchmarks/dry_run_table.jsonl]
        [--micro-batches N] [--cases mtnlg-530b:paper,...] [--table-only]

Writes one JSON line per rank as it finishes (`--out`), then a markdown table per preset on stdout.
"""
import argparse, json, os, platform, sys, time
from pathlib import Path

CASES = [("mtnlg-530b", "paper (TP8 PP35 DP8, recompute)", {}),
         ("mtnlg-530b", "recompute off, micro-batch 2", {"checkpoint_activations": 0, "micro_batch": 2}),
         ("mtnlg-530b", "TP4 PP35 DP16", {"tp": 4, "dp": 16}),
         ("gpt3-175b", "paper (TP8 PP16 DP8, recompute)", {}),
         ("gpt3-175b", "recompute off", {"checkpoint_activations": 0}),
         ("gpt3-175b", "TP4 PP32 DP16", {"tp": 4, "pp": 32, "dp": 16}),
         ("gpt3-1.3b", "preset (TP1 PP1 DP1, micro-batch 4)", {}),
         ("gpt3-1.3b", "recompute on", {"checkpoint_activations": 1}),
         ("gpt3-1.3b", "TP2 PP2 DP2", {"tp": 2, "pp": 2, "dp": 2})]
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries")
G = 2 ** 30


def table(rows) -> str:
    "Markdown: one row per rank, planned / measured GiB per category and in all, traffic and checkpoint."
    head = ("| preset, layout | stage | micro-batches | " + " | ".join(CATEGORIES) + " | peak | peak / plan | "
            "sent (GiB) / plan | checkpoint (GiB) / plan | dry run |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cats = " | ".join(f"{r['categories'][c]['measured'] / G:.2f} ({r['categories'][c]['planned'] / G:.2f})"
                          for c in CATEGORIES)
        sent = sum(v for k, v in r["comm_bytes"].items() if k != "scalars")
        plan_sent = sum(r["planned_comm_bytes"].values())
        sent_ratio = f"{sent / plan_sent:.4f}" if plan_sent else ("1" if sent == 0 else "-")
        out.append(f"| {r['preset']}, {r['layout']} | {r['stage']} | {r['micro_batches']} | {cats} | "
                   f"{r['peak_bytes'] / G:.2f} ({r['planned_bytes'] / G:.2f}) | "
                   f"{r['peak_bytes'] / r['planned_bytes']:.4f} | {sent / G:.2f} / {sent_ratio} | "
                   f"{r['checkpoint_bytes'] / G:.3f} / {r['checkpoint_bytes'] / r['planned_checkpoint_bytes']:.4f} | "
                   f"{r['wall_s']:.0f} s, {r['host_peak_bytes'] / G:.2f} GiB |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/dry_run_table.jsonl")
    ap.add_argument("--micro-batches", type=int, default=None, help="a step's (default: each config's own)")
    ap.add_argument("--cases", default=None, help="comma-separated preset:layout-start selections")
    ap.add_argument("--table-only", action="store_true", help="print the table of --out's records, run nothing")
    a = ap.parse_args()
    if a.table_only: return print(table([json.loads(line) for line in Path(a.out).open()]))
    import mtnlg.dryrun as D
    from mtnlg.config import load_config
    done = []
    out = Path(a.out)
    out.write_text("")
    for preset, layout, over in CASES:
        if a.cases and not any(f"{preset}:{layout}".startswith(c) for c in a.cases.split(",")): continue
        cfg = D.with_micro_batches(load_config(preset, overrides=over), a.micro_batches)
        for rank in D.default_ranks(cfg):
            r = D.with_plan(D.dry_run(cfg, rank), cfg)
            r.update(preset=preset, layout=layout, overrides=over, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     machine=f"{platform.machine()}, {os.cpu_count()} CPUs")
            done.append(r)
            with out.open("a") as f: f.write(json.dumps(r) + "\n")
            print(f"{preset} {layout} rank {rank} stage {r['stage']}: {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
    print(table(done))


if __name__ == "__main__":
    main()
