"""Dry runs of drawn small configurations, one JSON line each: the draw, what the dry run measured, what the planner
says (or the one line it refuses with). Run by tests/test_dryrun.py (argv: pairs of a seed, or "named" for the
rows of `NAMED`, and a number of rows), all in one process; tests/dryrun_worker.py runs its `rows` in its own."""
import dataclasses, json, random, sys
import mtnlg.dryrun as D, mtnlg.plan as P
from mtnlg.config import ConfigError, load_config


def draw(rng: random.Random) -> dict:
    "One configuration from the space `mtnlg plan` and `RunConfig` accept, at small shapes."
    layers = rng.randint(2, 6)
    heads = rng.choice((2, 4))
    return dict(layers=layers, hidden=rng.choice((64, 128)), heads=heads, seq=rng.choice((32, 64)),
                ffn_mult=rng.choice((2, 4)), tie=rng.random() < 0.8, dropout=rng.choice((0.0, 0.1)),
                tp=rng.choice((1, 2)), pp=rng.randint(1, min(3, layers)), dp=rng.choice((1, 2, 3)),
                micro_batch=rng.choice((1, 2)), micro_batches=rng.randint(1, 5),
                interval=rng.choice((0, 1, 1, 2, 3)), zero=rng.choice((0, 1)), precision=rng.choice(("bf16", "fp32")),
                grad_reduce=rng.choice(("fp32", "bf16")), rank_u=rng.random())


def config(d: dict):
    "The `RunConfig` of a draw."
    cfg = load_config("tiny")
    m = dataclasses.replace(cfg.model, num_layers=d["layers"], hidden_size=d["hidden"], num_heads=d["heads"],
                            ffn_hidden_size=d["ffn_mult"] * d["hidden"], seq_length=d["seq"],
                            tie_embeddings=d["tie"], hidden_dropout=d["dropout"], attention_dropout=d["dropout"])
    p = dataclasses.replace(cfg.parallel, tp=d["tp"], pp=d["pp"], dp=d["dp"], micro_batch=d["micro_batch"],
                            checkpoint_activations=d["interval"], zero_stage=d["zero"], grad_reduce_dtype=d["grad_reduce"])
    return D.with_micro_batches(dataclasses.replace(cfg, model=m, parallel=p, precision=d["precision"]),
                                d["micro_batches"])


BASE = dict(layers=4, hidden=64, heads=4, seq=64, ffn_mult=4, tie=True, dropout=0.0, tp=1, pp=1, dp=1, micro_batch=2,
            micro_batches=4, interval=0, zero=1, precision="fp32", grad_reduce="fp32", rank_u=0.0)
# rows the planner got wrong (the first three) or answered with a number it could not count (the last two)
NAMED = {"fp32 through ZeRO-1 (the tiny preset)": BASE,
         "bf16 at ZeRO 0 over DP 2": dict(BASE, precision="bf16", zero=0, dp=2),
         "DP 3: DeepSpeed pads each group": dict(BASE, precision="bf16", dp=3, pp=2, rank_u=0.9),
         "recompute interval 2": dict(BASE, precision="bf16", interval=2, pp=2),
         "recompute interval 3, micro-batch 2": dict(BASE, precision="bf16", interval=3, layers=6)}


def rows(argv: list[str]):
    "Each row of the sets `argv` names (pairs: a seed, or 'named', and how many of its rows): a dict, one dry run."
    for what, n in zip(argv[::2], map(int, argv[1::2])):
        rng = None if what == "named" else random.Random(int(what))
        for i in range(n):
            d = list(NAMED.values())[i] if rng is None else draw(rng)
            cfg = config(d)
            rank = int(d["rank_u"] * cfg.parallel.world_size)
            try: refused = P.check_counted(cfg)
            except ConfigError as e: refused = str(e)
            result = None if refused else D.with_plan(D.dry_run(cfg, rank, 2), cfg)     # a refused one: nothing to hold
            yield dict(set=what, draw=d, index=i, rank=rank, refused=refused, result=result)


if __name__ == "__main__":
    for row in rows(sys.argv[1:]): print(json.dumps(row), flush=True)
