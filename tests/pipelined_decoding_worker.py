"""One rank of the pipelined-decoding test: the same prompts decoded one batch at a time (`in_flight=1`, the plain
loop) and with PP batches in flight, greedy and sampled, then with stop strings taken from the run without; each
stage's step intervals recorded by torch hooks on its blocks; rank 0 writes tokens, finishes, seconds and intervals
as JSON.
Usage: torchrun --nproc-per-node=PP tests/pipelined_decoding_worker.py RUN_DIR OUT.json PP"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
import torch.distributed as dist
from mtnlg.generate import load_generator, generate_until
from mtnlg.topology import shutdown

# ten prompts of 1 to 11 tokens, two a batch: five batches, more than PP4 has slots
PROMPTS = ["Hello", "The quick brown fox", "In the beginning God created the heaven and the earth", "Once upon a",
           "It was the best of times, it was the worst", "Call me", "A", "To be or not to be, that is",
           "All happy families are alike", "The sky above the port was"]
BATCH, NEW = 2, 12
SAMPLE = dict(do_sample=True, temperature=0.9, top_k=40, top_p=0.95, seed=7)


HOLD = 0.01       # seconds each forward of a stage is held (Busy)


class Busy:
    "Start and end times of every step of this rank's blocks (a pre-hook on the first, a hook on the last)."
    # Each one holds its stage HOLD seconds longer (a sleep: no CPU), so stages in flight together overlap in time
    # however busy the machine's cores are (on 2 cores beside other tests, millisecond forwards could take turns);
    # with one batch in flight the schedule still keeps them apart (the tests' control).
    def __init__(self, blocks):
        self.spans, self._t0 = [], None
        blocks[0].register_forward_pre_hook(lambda m, a: setattr(self, "_t0", time.perf_counter()))
        blocks[-1].register_forward_hook(lambda m, a, o: self._end())

    def _end(self):
        time.sleep(HOLD)
        self.spans.append((self._t0, time.perf_counter()))


def gathered(x) -> list:
    "`x` of every rank."
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    return out


def decode(gen, busy, in_flight: int, **kw) -> dict:
    "Tokens, finishes, seconds and every rank's step intervals of PROMPTS, `in_flight` batches at once."
    busy.spans.clear()
    dist.barrier()
    t0 = time.perf_counter()
    gs = gen.generate(PROMPTS, batch_size=BATCH, in_flight=in_flight, max_new_tokens=NEW, **kw)
    secs = time.perf_counter() - t0
    return {"tokens": [g.tokens for g in gs], "finish": [g.finish for g in gs], "texts": [g.text for g in gs],
            "seconds": secs, "spans": gathered(busy.spans)}


def stops_of(run: dict) -> list[str]:
    "Stop strings from a run without: two characters a quarter into rows 0 and 1 (so batch 0 ends early)."
    return [t[len(t) // 4:][:2] or t for t in run["texts"][:2]]


if __name__ == "__main__":
    run, out, pp = sys.argv[1], sys.argv[2], int(sys.argv[3])
    gen = load_generator(run, 1, pp)
    busy = Busy(gen.dec.m.blocks)
    res = {"pp": pp, "stage_of_rank": gathered(gen.dec.stage), "replica_of_rank": gathered(0)}
    for name, kw in [("greedy", {}), ("sample", SAMPLE)]:
        for key, n in [("one", 1), ("piped", pp)]:
            res[f"{name}_{key}"] = decode(gen, busy, n, **kw)
        stop = stops_of(res[f"{name}_one"])
        for key, n in [("one", 1), ("piped", pp)]:
            res[f"{name}_stop_{key}"] = decode(gen, busy, n, stop=stop, **kw) | {"stop": stop}
    reqs = [(p, {"until": res["greedy_stop_one"]["stop"], "max_gen_toks": 8}) for p in PROMPTS]
    res["until_one"], res["until_piped"] = [generate_until(gen, reqs, BATCH, in_flight=n) for n in (1, pp)]
    if gen.rank0:
        with open(out, "w") as f: json.dump(res, f)
    shutdown()
