"""Planner predictions (mtnlg.plan) against a real 1-process model of this project (mtnlg.model).

Measures, on CPU, by counting tensors:
  - parameters: unique parameter tensors of the model (tied weights counted once);
  - model-state bytes: parameters + gradients + optimizer-state tensors of a real torch AdamW after one step
    (fp32: weights, grads, exp_avg, exp_avg_sq);
  - activation bytes: the unique storages autograd saves for backward during one training forward of one
    micro-batch (saved_tensors_hooks; parameters excluded), the CPU stand-in for the peak allocation;
and compares them with `param_counts` and `model_state_bytes`. Prints a markdown table; exits 1 if any
prediction is off by more than 10%.

Usage: OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python benchmarks/plan_vs_measured.py [--preset tiny ...]
"""
import argparse, importlib, json, os, platform, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "1"); os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
from mtnlg.config import load_config
from mtnlg import plan as P

CASES = {  # name: config overrides on the tiny preset (fp32, dropout 0, micro-batch 2, 1 process)
    "tiny": {},
    "small L6 h256 s128": dict(layers=6, hidden=256, heads=8, seq=128),
    "small L6 h256 s128, checkpointing": dict(layers=6, hidden=256, heads=8, seq=128, checkpoint_activations=1),
    "125M-like L12 h768 s256": dict(layers=12, hidden=768, heads=12, seq=256),
    "125M-like L12 h768 s256, checkpointing": dict(layers=12, hidden=768, heads=12, seq=256, checkpoint_activations=1),
}

def build_model(cfg):
    "The project's 1-process decoder for `cfg` (mtnlg.model)."
    try: M = importlib.import_module("mtnlg.model")
    except ModuleNotFoundError as e:
        if e.name != "mtnlg.model": raise
        sys.exit("plan_vs_measured: mtnlg.model is not built yet (issue 4); nothing to measure")
    from mtnlg.topology import init_distributed
    init_distributed(cfg.parallel)          # a 1-process gloo world: megatron-core's TP layers need their groups
    model = M.GPT(cfg.model, cfg.parallel.checkpoint_activations)
    M.load_full_state(model, M.init_full_state(cfg.model, cfg.seed), cfg.model)
    return model

def unique(tensors):
    "Tensors with distinct storage (a tied weight counts once)."
    seen, out = set(), []
    for t in tensors:
        if t is None: continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen: seen.add(key); out.append(t)
    return out

def nbytes(ts): return sum(t.numel() * t.element_size() for t in ts)

def measure(model):
    "Parameter count and model-state bytes (weights, grads, AdamW states) of `model`, by counting tensors."
    params = unique(list(model.parameters()))
    n = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-4)
    for p in params: p.grad = torch.zeros_like(p)
    opt.step()
    states = unique([t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0])
    return dict(params=n, weights=nbytes(params), grads=nbytes(unique([p.grad for p in params])), optimizer=nbytes(states))

def saved_activation_bytes(model, cfg):
    """Bytes autograd keeps for backward in one training step of one micro-batch (unique storages, parameters excluded):
    (stored at the end of the forward, peak = stored + the working set of one recomputed checkpoint segment).
    Under checkpointing the segments are recomputed one at a time in backward; they are identical blocks, so one
    segment's working set is the bytes saved during backward divided by the number of segments."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {"fwd": {}, "bwd": {}}
    phase, keep = ["fwd"], []
    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[phase[0]][st.data_ptr()] = st.nbytes()
            keep.append(st)           # hold it, so a freed storage's address cannot be reused and hide a later one
        return t
    b, S = cfg.parallel.micro_batch, cfg.model.seq_length
    tok = torch.randint(0, cfg.model.vocab_size, (b, S))
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model.loss(tok, torch.roll(tok, -1, 1))
        phase[0] = "bwd"
        loss.backward()
    k = cfg.parallel.checkpoint_activations
    segments = -(-cfg.model.num_layers // k) if k else 1
    stored = sum(seen["fwd"].values())
    return stored, stored + sum(seen["bwd"].values()) / segments

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=list(CASES), help=f"subset of: {list(CASES)}")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    rows, bad = [], False
    for name in a.cases:
        cfg = load_config("tiny", overrides=CASES[name])
        t0 = time.time()
        model = build_model(cfg)
        got = measure(model)
        stored, act = saved_activation_bytes(model, cfg)
        pred_a = P.memory_per_gpu(cfg)["peak"]["activations"]
        L, k = cfg.model.num_layers, cfg.parallel.checkpoint_activations
        pred_stored = pred_a - (min(k, L) * P.activation_bytes_per_layer(cfg, "none") if k else 0)
        pred_p = P.param_counts(cfg.model, cfg.parallel.tp)["total"]
        pred_s = P.model_state_bytes(pred_p, cfg.precision, 0, 1)["total"]
        got_s = got["weights"] + got["grads"] + got["optimizer"]
        row = dict(case=name, precision=cfg.precision, recompute=P.memory_per_gpu(cfg)["recompute"], params_pred=pred_p, params_meas=got["params"],
                   states_pred=pred_s, states_meas=got_s, stored_pred=pred_stored, stored_meas=stored, act_pred=pred_a, act_meas=act,
                   peak_pred=pred_s + pred_a, peak_meas=got_s + act, seconds=round(time.time() - t0, 2))
        for k in ("params", "states", "stored", "act", "peak"): row[k + "_err"] = row[k + "_pred"] / row[k + "_meas"] - 1
        bad |= any(abs(row[k + "_err"]) > 0.10 for k in ("params", "states", "peak"))
        rows.append(row); del model
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; machine: {platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}")
    print("| case | recompute | parameters pred / meas (err) | model states, bytes pred / meas (err) | activations stored after forward, pred / meas (err) | activation peak, pred / meas (err) | peak (states + activations) err |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['recompute']} | {r['params_pred']:,} / {r['params_meas']:,} ({100 * r['params_err']:+.2f}%) "
              f"| {r['states_pred']:,.0f} / {r['states_meas']:,} ({100 * r['states_err']:+.2f}%) "
              f"| {r['stored_pred']:,.0f} / {r['stored_meas']:,} ({100 * r['stored_err']:+.1f}%) "
              f"| {r['act_pred']:,.0f} / {r['act_meas']:,.0f} ({100 * r['act_err']:+.1f}%) | {100 * r['peak_err']:+.1f}% |")
    if a.json:
        tmp = a.json + ".tmp"; open(tmp, "w").write(json.dumps(rows, indent=2)); os.replace(tmp, a.json)
    from mtnlg.topology import shutdown
    shutdown()
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
