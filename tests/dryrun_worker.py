"""The dry runs of tests/test_dryrun.py that are not its `mtnlg` entry-point run, in one process
(each process would pay torch's, DeepSpeed's and megatron-core's imports again): the 530B rank over 80 GB and another
TP and DP rank, the counting on real tensors, the fast dry run against the full one, `--fake-steps 1` and an uncounted
setting; then the draws of tests/plan_draws_worker.py (its `rows`) that ARGV names. `mtnlg plan --fake-run` runs
here through `mtnlg.cli.main`, as the `mtnlg` command runs it; several dry runs in one process are what the command
does for several `--ranks`. One JSON object, the last line of stdout.
Usage: python tests/dryrun_worker.py [SEED-or-named ROWS ...]"""
import contextlib, io, json, sys
import mtnlg.dryrun as D
import plan_draws_worker
from mtnlg.cli import main
from mtnlg.config import ConfigError, load_config

def cli(*argv) -> dict:
    "`mtnlg ARGV` in this process: its exit code, stdout and stderr."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: rc = main(list(argv))
        except SystemExit as e: rc = e.code
    return dict(rc=rc, out=out.getvalue(), err=err.getvalue()[-4000:])


def counting() -> list[dict]:
    "A small model's ranks 0 and 4, each on real tensors and on fake ones (the CPU's kernels both times)."
    cfg = load_config("tiny", overrides=dict(tp=2, pp=2, dp=2, micro_batch=2, global_batch=16, precision="bf16",
                                             layers=4, hidden=256, heads=4, seq=256))
    runs = [D.dry_run(cfg, rank, micro_batches=4, fake=fake, gpu_kernels=False)
            for rank in (0, 4) for fake in (False, True)]
    return [dict(r["measured"], peak=r["peak_bytes"]) for r in runs]


# micro-batches of the full run: past the fast run's 2 and 3, so each stage's traffic, and the memory of the
# stages whose micro-batches in flight stop growing before 3 (the middle and last), are extrapolated; the first
# stage's 3 in flight are reached (as at any count past 3)
FULL = 4


def fast() -> dict:
    """A first, middle and last stage, fast (2 and 3 micro-batches) and full (`FULL`); then, with a budget of 0
    bytes, rank 0's fast dry run again, which reads the dry run it already made (`reused`: the refusal is of that
    very run)."""
    cfg = D.with_micro_batches(load_config("tiny", overrides=dict(layers=6, hidden=128, heads=4, seq=128, tp=2, pp=3,
                                           micro_batch=1, checkpoint_activations=1, precision="bf16")), FULL)
    dry_run, bookkeeping, made, reused = D.dry_run, D.BOOKKEEPING, {}, []
    def once(*a, **kw):
        "`dry_run`, each call's arguments run once."
        key = repr((a, sorted(kw.items())))
        if key in made: reused.append(key)
        else: made[key] = dry_run(*a, **kw)
        return made[key]
    D.dry_run = once                                    # what `fast_dry_run` calls
    try:
        out = [(D.fast_dry_run(cfg, r), dry_run(cfg, r)) for r in (0, 2, 4)]
        D.BOOKKEEPING = -1
        try: D.fast_dry_run(cfg, 0); refused = ""
        except ConfigError as e: refused = str(e)
    finally: D.dry_run, D.BOOKKEEPING = dry_run, bookkeeping
    pair = lambda f: dict(f["measured"], peak=f["peak_bytes"], comm=f["comm_bytes"])
    return dict(pairs=[[pair(f), pair(g)] for f, g in out], refused=refused, reused=len(reused))


if __name__ == "__main__":
    over = cli("plan", "--fake-run", "--json", "--preset", "mtnlg-530b", "--set", "parallel.checkpoint_activations=0",
               "--micro-batch", "2", "--micro-batches", "35", "--ranks", "0")
    other = cli("plan", "--fake-run", "--json", "--preset", "mtnlg-530b", "--micro-batches", "2", "--ranks", "1999")
    one = cli("plan", "--fake-run", "--preset", "tiny", "--fake-steps", "1")
    two = cli("plan", "--fake-run", "--preset", "tiny", "--set", "precision=bf16", "--set",
              "parallel.checkpoint_activations=2")
    drawn = list(plan_draws_worker.rows(sys.argv[1:]))
    print(json.dumps(dict(over=over, other=other, one_step=one, two_steps=two, counting=counting(), fast=fast(),
                          drawn=drawn)))
