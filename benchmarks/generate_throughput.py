"""Generated tokens/s of `mtnlg.generate` with and without the KV cache, and of transformers' `generate` on the fp32
HF export of the same weights, in one run; the greedy tokens of all three are checked equal.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/generate_throughput.py [--layers 4] [--hidden 256] [--seq 512]
        [--batch 4] [--prompt-len 32] [--new-tokens 128] [--repeats 3]

The model is a random GPT of the given size written as a checkpoint (speed does not depend on the weights); the
prompts are random token ids of one length. EOD does not stop a row, so every row makes --new-tokens tokens. Prints
one JSON line per decoder (median of --repeats rounds, the decoders interleaved, after one warm-up) and a
Markdown table.
"""
import argparse, json, platform, statistics, tempfile, time
from pathlib import Path

import torch


def timed(fns: dict, repeats: int) -> tuple[dict, dict]:
    "({name: median seconds}, {name: last result}): one warm-up each, then the decoders in turn, `repeats` rounds."
    out = {name: fn() for name, fn in fns.items()}
    secs = {name: [] for name in fns}
    for _ in range(repeats):                       # interleaved: a busy machine slows every decoder alike
        for name, fn in fns.items():
            if torch.cuda.is_available(): torch.cuda.synchronize()
            t0 = time.perf_counter()
            out[name] = fn()
            if torch.cuda.is_available(): torch.cuda.synchronize()
            secs[name].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in secs.items()}, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-nocache", action="store_true", help="do not time the uncached loop (slow on big settings)")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM
    from mtnlg.config import ModelConfig, RunConfig
    from mtnlg.checkpoint import write_weights
    from mtnlg.model import init_full_state
    from mtnlg.export import export_run
    from mtnlg.generate import load_generator, Sampling
    cfg = ModelConfig(num_layers=a.layers, hidden_size=a.hidden, num_heads=a.heads, seq_length=a.seq,
                      hidden_dropout=0.0, attention_dropout=0.0)
    tmp = Path(tempfile.mkdtemp())
    full = init_full_state(cfg, seed=0)
    write_weights(tmp / "run" / "checkpoints" / "step00000001", RunConfig(model=cfg), lambda n: full[n])
    hf_dir = export_run(tmp / "run", tmp / "hf", dtype="fp32")
    gen = load_generator(tmp / "run")
    dev = gen.dec.device
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(dev).eval()
    ids = torch.randint(0, 50000, (a.batch, a.prompt_len), generator=torch.Generator().manual_seed(0)).tolist()
    s = Sampling(max_new_tokens=a.new_tokens, stop_at_eod=False)
    x = torch.tensor(ids, device=dev)

    def hf_generate():
        with torch.no_grad():
            out = hf.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=a.new_tokens,
                              min_new_tokens=a.new_tokens, do_sample=False, pad_token_id=0)
        return out[:, a.prompt_len:].tolist()

    runs = {"mtnlg.generate, KV cache": lambda: [r[1] for r in gen.generate_ids(ids, s, use_cache=True)],
            "transformers generate (KV cache)": hf_generate}
    if not a.skip_nocache: runs["mtnlg.generate, no cache"] = lambda: [r[1] for r in gen.generate_ids(ids, s, use_cache=False)]
    res, toks = timed(runs, a.repeats)
    for name, sec in res.items():
        print(json.dumps({"decoder": name, "seconds": round(sec, 3), "tokens": a.batch * a.new_tokens,
                          "tokens_per_s": round(a.batch * a.new_tokens / sec, 1)}), flush=True)
    same = all(t == toks["mtnlg.generate, KV cache"] for t in toks.values())
    ref = res["transformers generate (KV cache)"]
    dev_name = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.machine()})"
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {dev_name}; torch {torch.__version__}; "
          f"{a.layers} layers, hidden {a.hidden}, {a.heads} heads; batch {a.batch}, prompt {a.prompt_len}, "
          f"{a.new_tokens} new tokens; median of {a.repeats}; greedy tokens identical: {same}\n")
    print("| decoder | seconds | tokens/s | vs transformers |\n|---|---:|---:|---:|")
    for name, sec in res.items():
        print(f"| {name} | {sec:.2f} | {a.batch * a.new_tokens / sec:.1f} | {ref / sec:.2f}x |")
    if not same: raise SystemExit("the decoders disagree on the greedy tokens")


if __name__ == "__main__":
    main()
