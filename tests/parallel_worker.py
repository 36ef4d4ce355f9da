"""Worker launched by tests/test_parallel.py under torchrun: runs several layouts in one launch.

The launch's processes are regrouped, phase by phase, into independent sub-worlds (tests/subworld.py), so one
8-process launch runs e.g. TP2xPP2xDP2 on all 8, then PP4 on 4 + TP2 on 2 + PP2 on 2 side by side, and so on. Each job trains 5
steps from the same seeded full state and writes its losses, gradient norms, a slice->gather round-trip check and
log-probabilities to OUT/<job>.json for the test to compare with the 1-process reference job.

Usage: torchrun --nproc-per-node N tests/parallel_worker.py PLAN.json OUT_DIR
"""
import json, os, sys, time, traceback, warnings
warnings.filterwarnings("ignore")
if "strict_deprecations" in sys.modules: sys.modules["strict_deprecations"].install()   # tests/strict
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch

from mtnlg.config import load_config
from mtnlg.topology import init_distributed, shutdown
from mtnlg.model import GPT, init_full_state, load_full_state as load_gpt, init_parameters, full_named_parameters, shard
from mtnlg.pipeline import build_pipeline, build_engine, eval_logprobs, param_groups
from mtnlg.eval import gpt_scorer, pipeline_scorer
from subworld import run_plan, write_json

GLOBAL_BATCH, STEPS = 8, 5


def make_cfg(job):
    ov = {"vocab": 1000, "layers": 6, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 2,
          "global_batch": GLOBAL_BATCH, "seed": 1234, "lr": 1e-3, "model.pad_vocab_to": 48,
          "optim.grad_clip": 1.0, "optim.weight_decay": 0.1, "model.hidden_dropout": 0.0,
          "model.attention_dropout": 0.0, "precision": "fp32", "zero": 0}
    ov.update(job.get("set", {}))
    return load_config("tiny", overrides=ov)


def step_batch(cfg, step):
    "The global batch of `step`: GLOBAL_BATCH sequences of seq_length+1 tokens."
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, cfg.model.vocab_size, (GLOBAL_BATCH, cfg.model.seq_length + 1), generator=g)


def micro_batches(cfg, step, dp, dp_rank):
    t = step_batch(cfg, step)
    rows = t.chunk(dp)[dp_rank]
    return [(m[:, :-1].contiguous(), m[:, 1:].contiguous()) for m in rows.split(cfg.parallel.micro_batch)]


def eval_batch(cfg):
    t = torch.randint(0, cfg.model.vocab_size, (cfg.parallel.micro_batch, cfg.model.seq_length + 1), generator=torch.Generator().manual_seed(7))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def scorer_requests(cfg):
    "Scoring requests of different lengths (two batches of 4 of different shapes), and contexts to continue."
    g = torch.Generator().manual_seed(11)
    tok = lambda n: torch.randint(0, cfg.model.vocab_size, (n,), generator=g).tolist()
    reqs = [(tok(5 + 4 * i), tok(1 + i % 3)) for i in range(6)] + [(tok(40), tok(2))]   # the last is cut to the window
    return reqs, [tok(3 + 5 * i) for i in range(5)]


def score(scorer, cfg, out):
    "What evaluation asks of a scorer: log-likelihoods with greedy flags, and 3 greedily generated tokens."
    reqs, ctxs = scorer_requests(cfg)
    ll = scorer.loglikelihood(reqs)
    out.update(score_ll=[x for x, _ in ll], score_greedy=[f for _, f in ll], score_gen=scorer.greedy_generate(ctxs, 3))


def run_reference(cfg, out):
    "1-process reference: plain GPT module, torch AdamW, torch clip_grad_norm_."
    topo = init_distributed(cfg.parallel, timeout_s=120, run_cfg=cfg)
    full = init_full_state(cfg.model, cfg.seed)
    model = load_gpt(GPT(cfg.model), full, cfg.model)
    o = cfg.optim
    opt = torch.optim.AdamW(param_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    with torch.no_grad():
        model.eval(); lp, greedy = model.logprobs(*eval_batch(cfg))
        score(gpt_scorer(model, batch_size=4), cfg, out); model.train()
    out.update(eval_logp=lp.tolist(), eval_greedy=greedy.tolist())
    for step in range(STEPS):
        t = step_batch(cfg, step)
        opt.zero_grad()
        loss = model.loss(t[:, :-1], t[:, 1:])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        out["loss"].append(loss.item()); out["gnorm"].append(norm.item())
    return topo


def run_layout(cfg, out):
    topo = init_distributed(cfg.parallel, timeout_s=120, run_cfg=cfg)
    full = init_full_state(cfg.model, cfg.seed)
    module = init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed)    # own slices only, as training does
    bad = [n for n, p in full_named_parameters(module)                # every rank: its slices of the full init
           if not torch.equal(p.detach(), shard(n, full[n], cfg.model, topo.tp, topo.tp_rank))]
    out["roundtrip_bad"] = bad
    if bad: raise AssertionError(f"rank {topo.rank}: its init slices differ from the full init: {bad[:3]}")
    engine = build_engine(cfg, topo, module)
    x, y = eval_batch(cfg)
    res = eval_logprobs(engine, iter([(x, y)]), num_micro_batches=1)
    if res is not None and topo.tp_rank == 0 and topo.dp_rank == 0:
        out["eval_logp"] = torch.cat([r[0] for r in res]).tolist()
        out["eval_greedy"] = torch.cat([r[1] for r in res]).tolist()
    if cfg.precision == "fp32": score(pipeline_scorer(engine, topo, batch_size=4), cfg, out)   # then training goes on
    for step in range(STEPS):
        loss = engine.train_batch(iter(micro_batches(cfg, step, topo.dp, topo.dp_rank)))
        out["loss"].append(float(loss)); out["gnorm"].append(float(engine.get_global_grad_norm()))
    return topo


def run_job(job, out):
    "One job of the plan in its sub-world (tests/subworld.py); the last stage also writes its log-probabilities."
    out.update(loss=[], gnorm=[])
    (run_reference if job.get("reference") else run_layout)(make_cfg(job), out)
    if "eval_logp" in out and int(os.environ["RANK"]) != 0:
        write_json(os.path.join(sys.argv[2], f"{job['name']}.eval.json"), out)


if __name__ == "__main__":
    sys.exit(run_plan(run_job))
