"""One rank of the pipelined-scoring test: the same requests scored through `pipeline_scorer` with one micro-batch
per pass and with `in_flight` micro-batches per pass (led by rank 0, as `mtnlg eval` runs), each stage's forward
intervals recorded by torch forward hooks; rank 0 writes the scores and intervals as JSON.
Usage: torchrun --nproc-per-node=N tests/pipelined_scoring_worker.py OUT.json PP [IN_FLIGHT]"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
import torch.distributed as dist
from mtnlg.config import load_config
from mtnlg.topology import init_distributed, shutdown
from mtnlg.model import init_parameters
from mtnlg.pipeline import build_pipeline
from mtnlg.eval import pipeline_scorer, lead_forwards, follow_forwards, stop_followers

BATCH, REQUESTS, SEQ = 4, 48, 128


def requests(vocab: int) -> list:
    "REQUESTS (context, continuation) token lists of lengths spread over the window."
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()
    return [(ids(int(torch.randint(4, SEQ - 4, (), generator=g))), ids(1 + i % 4)) for i in range(REQUESTS)]


def engine_and_topo(pp: int):
    "A tiny 8-layer pipeline (fp32, no dropout) on pp stages and world / pp replicas, as DeepSpeed runs it."
    import deepspeed
    world = int(os.environ["WORLD_SIZE"])
    cfg = load_config("tiny", overrides={"vocab": 1000, "layers": 8, "hidden": 64, "heads": 4, "seq": SEQ,
                                         "micro_batch": BATCH, "global_batch": BATCH * (world // pp), "pp": pp,
                                         "tp": 1, "dp": world // pp, "model.pad_vocab_to": 64,
                                         "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
                                         "precision": "fp32", "zero": 0})
    topo = init_distributed(cfg.parallel, run_cfg=cfg)
    module = init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed)
    engine, *_ = deepspeed.initialize(model=module, config={
        "train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
        "train_batch_size": BATCH * topo.dp, "steps_per_print": 10 ** 9})
    return engine, topo, cfg


HOLD = 0.01       # seconds each forward of a stage is held (Busy)


class Busy:
    "Start and end times of every forward of this rank's stage (torch forward hooks)."
    # Each one holds its stage HOLD seconds longer (a sleep: no CPU), so stages in flight together overlap in time
    # however busy the machine's cores are (on 2 cores beside other tests, millisecond forwards could take turns);
    # with one batch in flight the schedule still keeps them apart (the tests' control).
    def __init__(self, module):
        self.spans, self._t0 = [], None
        module.register_forward_pre_hook(lambda m, a: setattr(self, "_t0", time.perf_counter()))
        module.register_forward_hook(lambda m, a, o: self._end())

    def _end(self):
        time.sleep(HOLD)
        self.spans.append((self._t0, time.perf_counter()))


def score_led(engine, topo, reqs, busy, **kw) -> tuple:
    "Scores (on rank 0) of `reqs` through a led `pipeline_scorer`, seconds, and every rank's forward intervals."
    scorer = pipeline_scorer(engine, topo, BATCH, **kw)
    busy.spans.clear()
    dist.barrier()
    t0, out = time.perf_counter(), None
    if topo.rank == 0:
        out = lead_forwards(scorer).loglikelihood(reqs)
        stop_followers(scorer)
    else: follow_forwards(scorer)
    secs = time.perf_counter() - t0
    spans = [None] * dist.get_world_size()
    dist.all_gather_object(spans, busy.spans)
    return out, secs, spans


if __name__ == "__main__":
    out_file, pp = sys.argv[1], int(sys.argv[2])
    in_flight = int(sys.argv[3]) if len(sys.argv) > 3 else 2 * pp
    engine, topo, cfg = engine_and_topo(pp)
    busy = Busy(engine.module)
    reqs = requests(cfg.model.vocab_size)
    res = {"pp": pp, "dp": topo.dp, "in_flight": in_flight,
           "stage_of_rank": [None] * dist.get_world_size()}
    res["replica_of_rank"] = [None] * dist.get_world_size()
    dist.all_gather_object(res["stage_of_rank"], topo.pp_rank)
    dist.all_gather_object(res["replica_of_rank"], topo.dp_rank)
    for name, kw in [("today", dict(in_flight=1, bucket=0)), ("m1", dict(in_flight=1)),
                     ("pipelined", dict(in_flight=in_flight))]:
        ll, secs, spans = score_led(engine, topo, reqs, busy, **kw)
        res[name] = {"ll": ll, "seconds": secs, "spans": spans}
    # every rank scoring the same requests itself (no leader), pipelined
    res["unled"] = {"ll": pipeline_scorer(engine, topo, BATCH, in_flight=in_flight).loglikelihood(reqs)}
    if topo.rank == 0:
        with open(out_file, "w") as f: json.dump(res, f)
    shutdown()
