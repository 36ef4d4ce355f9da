"""Seconds of wall samples per process and per named part (a function on the stack) from the dumps of
benchmarks/stack_sampler.py: where a test's processes spent their time. Writes OUT.json.

    .venv/bin/python benchmarks/stack_shares.py SAMPLES_DIR OUT.json"""
import glob, json, sys
from pathlib import Path

# the parts asked about: a name -> a piece of a stack frame (file:function)
PARTS = {"lm-eval's Jinja compile (from_string)": "jinja2/environment.py:from_string",
         "lm-eval prompt templates (apply_template)": "lm_eval/utils.py:apply_template",
         "imports": "<frozen importlib._bootstrap>:_find_and_load",
         "scoring forwards (model.logprobs)": "mtnlg/model.py:logprobs",
         "vocabulary log-softmax, CE, greedy (token_logprobs)": "mtnlg/model.py:token_logprobs",
         "vocabulary logits matmul (tied_logits)": "mtnlg/model.py:tied_logits",
         "the one-process ICL runs (main, before the launch)": None,
         "the TP2 x PP2 studies (studies_on_shared_ranks)": "studies_worker.py:studies_on_shared_ranks",
         "waiting for the ranks to connect (_accept)": "mtnlg/session.py:_accept",
         "waiting for a rank's answer (answer)": "mtnlg/session.py:answer",
         "generation (generate_texts)": "mtnlg/session.py:generate_texts",
         "dry runs (dry_run)": "mtnlg/dryrun.py:dry_run",
         "fast vs full dry runs (dryrun_worker.fast)": "dryrun_worker.py:fast",
         "the draws (plan_draws_worker.rows)": "plan_draws_worker.py"}


def shares(path: str) -> dict:
    "One process' dump: its wall and CPU seconds and the wall seconds of each part of `PARTS` on its stack."
    j = json.loads(Path(path).read_text())
    dt = j.get("interval", 0.2)
    stacks = [(s.split("|"), v) for s, v in j["stacks"]]
    def on(piece): return round(dt * sum(v for s, v in stacks if any(piece in f for f in s)), 1)
    parts = {k: on(p) for k, p in PARTS.items() if p}
    if any("studies_worker.py:main" in f for s, _ in stacks for f in s):
        parts["the one-process ICL runs (main, before the launch)"] = round(dt * sum(
            v for s, v in stacks if any("studies_worker.py:main" in f for f in s)
            and not any("studies_on_shared_ranks" in f for f in s)), 1)
    return dict(argv=" ".join(j["argv"])[:160], wall_s=round(j["t1"] - j["t0"], 1), cpu_s=round(j["cpu"], 1),
                sampled_s=round(dt * sum(v for _, v in stacks), 1), parts={k: v for k, v in parts.items() if v})


if __name__ == "__main__":
    out = {Path(p).stem: shares(p) for p in sorted(glob.glob(f"{sys.argv[1]}/*.json"))}
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
