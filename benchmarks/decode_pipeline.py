"""Decoding throughput of `mtnlg.generate` at PP2 and PP4: one batch in flight (the plain loop, a stage at a time)
against PP batches in flight (pipelined), same ranks, same batches, one launch per layout, the two interleaved
`--repeat` times after a warm-up; generated tokens/s of each and the ratio pipelined / one. The tokens of the two
are checked equal.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decode_pipeline.py [--pp 2 4] [--layers 12] [--hidden 384]
        [--prompts 16] [--batch 2] [--new-tokens 16] [--repeat 3] [--out FILE.json]

The model is a random GPT of the given size written as a checkpoint (speed does not depend on the weights), the
prompts random token ids of 8 to 32 tokens; EOD does not stop a row, so every row makes --new-tokens tokens. On CPU
processes sharing few cores the stages compete for the cores, so the ratio there is bounded by the CPU, not the
schedule; with a GPU per stage each stage is busy at every tick instead of one tick in PP.
"""
import argparse, datetime, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rank_main(run: str, out: str, pp: int, a) -> None:
    "One rank: warm-up, then one batch in flight and PP in flight in turn; rank 0 writes seconds and tokens."
    import torch
    import torch.distributed as dist
    from mtnlg.generate import Sampling, load_generator
    from mtnlg.topology import shutdown
    gen = load_generator(run, 1, pp)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 50000, (int(torch.randint(8, 33, (), generator=g)),), generator=g).tolist()
           for _ in range(a.prompts)]
    batches = [(ids[b:b + a.batch], list(range(b, b + a.batch))[:len(ids[b:b + a.batch])])
               for b in range(0, len(ids), a.batch)]
    s = Sampling(max_new_tokens=a.new_tokens, stop_at_eod=False)
    secs, toks = {1: [], pp: []}, {}
    for r in range(a.repeat + 1):                      # round 0 warms up
        for n in (1, pp):
            dist.barrier()
            t0 = time.perf_counter()
            toks[n] = [row[1] for res in gen.generate_batches(batches, s, in_flight=n) for row in res]
            if r: secs[n].append(time.perf_counter() - t0)
    if gen.rank0:
        Path(out).write_text(json.dumps({"seconds_one": secs[1], "seconds_piped": secs[pp], "groups": len(batches),
                                         "tokens": sum(map(len, toks[1])), "equal": toks[1] == toks[pp]}))
    shutdown()


def launch(run: Path, pp: int, out: Path, argv: list[str]) -> dict:
    "This script on pp processes (TP1, PPpp); its JSON."
    sys.path.insert(0, str(ROOT))
    from mtnlg.jobs import launch_command
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    cmd = launch_command([str(Path(__file__).resolve()), *argv, "--rank", str(run), str(out), str(pp)], pp)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env | {"OMP_NUM_THREADS": "1"}, cwd=ROOT)
    if p.returncode: sys.exit(f"PP{pp} launch failed:\n{p.stderr[-3000:]}")
    return json.loads(out.read_text())


def checkpoint(d: Path, a) -> Path:
    "A random GPT of the asked size written as a run's checkpoint."
    sys.path.insert(0, str(ROOT))
    from mtnlg.config import ModelConfig, RunConfig
    from mtnlg.checkpoint import write_weights
    from mtnlg.model import FullInit
    cfg = ModelConfig(num_layers=a.layers, hidden_size=a.hidden, num_heads=a.heads, seq_length=128,
                      hidden_dropout=0.0, attention_dropout=0.0)
    full = FullInit(cfg, 0)
    write_weights(d / "run" / "checkpoints" / "step00000000", RunConfig(model=cfg), lambda n: full[n])
    return d / "run"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2, help="prompts a batch (prompts / batch batches in all)")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds of each (medians reported)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--rank", nargs=3, metavar=("RUN", "OUT", "PP"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank: return rank_main(a.rank[0], a.rank[1], int(a.rank[2]), a)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
            if k in ("layers", "hidden", "heads", "prompts", "batch", "new_tokens", "repeat")]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        run = checkpoint(Path(d), a)
        for pp in a.pp:
            r = launch(run, pp, Path(d) / f"pp{pp}.json", argv)
            one, piped = statistics.median(r["seconds_one"]), statistics.median(r["seconds_piped"])
            n, rounds = r["tokens"], (r["seconds_one"], r["seconds_piped"])
            rows.append(dict(pp=pp, groups=r["groups"], tokens=n, one_tok_per_s=round(n / one, 1),
                             piped_tok_per_s=round(n / piped, 1), ratio=round(one / piped, 3),
                             ratios_per_round=[round(x / y, 3) for x, y in zip(*rounds)],
                             tokens_equal=r["equal"]))
    res = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
               machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}", settings=argv,
               rows=rows)
    print(f"{'PP':>3} {'batches':>7} {'one tok/s':>10} {'pipelined tok/s':>16} {'ratio':>6}  per round")
    for r in rows:
        print(f"{r['pp']:>3} {r['groups']:>7} {r['one_tok_per_s']:>10} {r['piped_tok_per_s']:>16} {r['ratio']:>6} "
              f"{r['ratios_per_round']}  tokens equal: {r['tokens_equal']}")
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
