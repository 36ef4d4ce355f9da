"""mtnlg.plan: paper numbers, exact parameter count against megatron-core, rank placement against DeepSpeed and
megatron-core, model-state bytes against a real optimizer, and the `mtnlg plan` command."""
import json, os, subprocess, sys, textwrap
from pathlib import Path
from dataclasses import replace
import pytest
from conftest import ROOT, free_port
from mtnlg import plan as P
from mtnlg.config import load_config

BIG = load_config("mtnlg-530b")

def test_paper_numbers():
    pc = P.param_counts(BIG.model, tp=8)
    assert 529e9 < pc["total"] < 531e9 and pc["total_unpadded"] < pc["total"]
    assert 174e9 < P.param_counts(load_config("gpt3-175b", validate=False).model, 8)["total"] < 176e9
    assert P.model_state_bytes(pc["total"])["total"] > 10e12
    assert abs(P.activation_checkpoint_bytes_total(BIG) / 1e12 - 16.9) < 0.05
    assert round(P.tflops_per_gpu(BIG, 60.1)) == 126
    st = P.pipeline_stats(BIG)
    assert st["micro_batches"] == 240 and abs(st["bubble_fraction"] - 34 / 240) < 1e-12 and st["tokens_per_iteration"] == 1920 * 2048

def test_flops_without_recompute_is_three_quarters_of_block_work():
    f4, f3 = P.flops_per_iteration(BIG, "full"), P.flops_per_iteration(BIG, "none")
    logits = 6 * 1920 * 2048 * 20480 * 51200
    assert abs((f3 - logits) / (f4 - logits) - 0.75) < 1e-12

def test_zero_and_tp_slicing():
    c = P.with_layout(BIG, 8, 35, 8)
    states = [P.memory_per_gpu(replace(c, parallel=replace(c.parallel, zero_stage=z)))["peak"]["model_states"] for z in (0, 1)]
    assert abs(states[0] / P.stage_params(c)[0] - 20) < 1e-9 and abs(states[1] / P.stage_params(c)[0] - (8 + 12 / 8)) < 1e-9
    # slices over TP x PP add up to the whole model (replicated LN/bias/positions and the tied copy aside)
    total = sum(P.stage_params(c)) * 8
    assert 0 < total - P.param_counts(c.model, 8)["total"] < 0.01 * total


def test_check_layout_refuses_what_the_engine_cannot_run():
    "A layout the config refuses (ZeRO 2 at any pp: training always runs DeepSpeed's pipeline engine) is refused here too."
    cluster = P.get_cluster("dgx-a100-80gb", nodes=1)
    for pp in (1, 2):
        c = P.with_layout(load_config("gpt3-1.3b"), 1, pp, 8 // pp)
        assert isinstance(P.check_layout(c, cluster), list)              # control: the same layout at ZeRO 1 passes
        bad = replace(c, parallel=replace(c.parallel, zero_stage=2))     # built around the config's own checks
        with pytest.raises(P.ConfigError, match="parallel.zero_stage: must be 0 or 1"): P.check_layout(bad, cluster)

def test_calibration_round_trip_and_ranking():
    cl = P.get_cluster(nodes=280)
    eta = P.calibrate(BIG, cl, 60.1)
    assert abs(P.predict_time(BIG, cl, eta)["iteration_time"] - 60.1) < 1e-6
    assert abs(eta - P.PAPER_COMPUTE_FRACTION) < 0.005
    ranked = P.plan(BIG, cl)
    assert all(r["fits"] for r in ranked)
    times = [r["predicted"]["iteration_time"] for r in ranked]
    assert times == sorted(times)
    assert (ranked[0]["layout"]["tp"], ranked[0]["layout"]["pp"]) == (8, 35)
    # doubling the peak halves the compute part only: the predicted time drops, but by less than half
    fast = P.predict_time(BIG, P.get_cluster(nodes=280, peak_tflops=624.0))["iteration_time"]
    assert times[0] / 2 < fast < times[0]

@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (2, 2, 2), (4, 3, 5), (8, 35, 8), (2, 1, 4), (1, 6, 1)])
def test_placement_matches_deepspeed_and_megatron(tp, pp, dp):
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from megatron.core.parallel_state import RankGenerator
    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    ours = P.parallel_groups(tp, pp, dp)
    for axis, name in (("tp", "model"), ("pp", "pipe"), ("dp", "data")):
        assert sorted(topo.get_axis_comm_lists(name)) == ours[axis]
        assert sorted(RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp").get_ranks(axis)) == ours[axis]
        assert sorted(RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-pp-dp").get_ranks(axis)) == \
            P.parallel_groups(tp, pp, dp, "tp-pp-dp")[axis]
    rows = P.rank_placement(tp, pp, dp, gpus_per_node=8)
    for r in rows:
        c = topo.get_coord(r["rank"])
        assert (c.pipe, c.data, c.model) == (r["pp"], r["dp"], r["tp"]) and r["node"] == r["rank"] // 8
    assert all(len({rows[x]["node"] for x in g}) == 1 for g in ours["tp"])

def test_placement_rejects_tp_across_nodes():
    with pytest.raises(P.PlanError, match="spans nodes"): P.rank_placement(16, 1, 1, gpus_per_node=8)
    with pytest.raises(P.PlanError, match="does not divide gpus_per_node"): P.rank_placement(3, 1, 1, gpus_per_node=8)

MEGATRON_COUNT = textwrap.dedent("""
    import json, os, sys, torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from mtnlg.config import load_config
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", world_size=1, rank=0)
    parallel_state.initialize_model_parallel(1, 1)
    cfg = load_config("tiny", overrides=dict(layers=3, hidden=48, heads=4, seq=32, vocab=1000))
    m = cfg.model
    tc = TransformerConfig(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_heads,
                           ffn_hidden_size=m.ffn_hidden_size, use_cpu_initialization=True, add_bias_linear=True)
    model = GPTModel(tc, get_gpt_layer_local_spec(), vocab_size=m.padded_vocab_size(1), max_sequence_length=m.seq_length,
                     position_embedding_type="learned_absolute", share_embeddings_and_output_weights=True)
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters(): p.grad = torch.randn_like(p)   # megatron's attention needs CUDA for a forward pass
    opt.step()
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()] + \\
              [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    print(json.dumps(dict(params=n, state_bytes=sum(t.numel() * t.element_size() for t in tensors))))
    dist.destroy_process_group()
""")

def test_param_count_and_states_match_megatron_gpt_model(tmp_path):
    "The formula equals the parameter count of megatron-core's GPTModel of the same shape, and 16 bytes/param (fp32 AdamW)."
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", MEGATRON_COUNT, str(port)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    cfg = load_config("tiny", overrides=dict(layers=3, hidden=48, heads=4, seq=32, vocab=1000))
    assert got["params"] == P.param_counts(cfg.model)["total"]
    assert got["state_bytes"] == P.model_state_bytes(got["params"], "fp32")["total"]

# --- the command ---------------------------------------------------------------------------------------------------

def run_main(argv, capsys):
    from mtnlg.cli import main
    try: rc = main(["plan", *argv])
    except SystemExit as e: rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err

ISSUE_EXAMPLE = ["--preset", "mtnlg-530b", "--nodes", "280", "--gpus-per-node", "8", "--tp", "8", "--pp", "35",
                 "--iteration-time", "60.1", "--json"]

def test_cli_json_layout(capsys):
    rc, out, _ = run_main(ISSUE_EXAMPLE, capsys)
    j = json.loads(out)
    assert rc == 0
    for k in ("parameters", "bytes_per_parameter", "model_state_bytes_total", "activation_checkpoint_bytes_total",
              "model_state_bytes_per_gpu", "activation_bytes_per_gpu", "flops_per_iteration", "tflops_per_gpu", "layout"):
        assert k in j, k
    assert {k: j["layout"][k] for k in ("tp", "pp", "dp", "micro_batch", "gpus")} == dict(tp=8, pp=35, dp=8, micro_batch=1, gpus=2240)
    assert j["bytes_per_parameter"] == 20 and round(j["tflops_per_gpu"]) == 126 and j["fits"]

def test_cli_ranked(capsys):
    rc, out, _ = run_main(["--preset", "mtnlg-530b", "--nodes", "280", "--json", "--top", "0"], capsys)
    rows = json.loads(out)
    assert rc == 0 and isinstance(rows, list) and len(rows) > 5
    assert (rows[0]["layout"]["tp"], rows[0]["layout"]["pp"], rows[0]["layout"]["dp"]) == (8, 35, 8)
    rc, out, _ = run_main(["--preset", "mtnlg-530b", "--nodes", "280", "--tp", "4"], capsys)
    assert rc == 0 and all(l.split()[1] == "4" for l in out.splitlines()[2:])

@pytest.mark.parametrize("argv,msg", [
    (["--preset", "mtnlg-530b", "--nodes", "280", "--tp", "8", "--pp", "30"], "does not divide the 2240 GPUs"),
    (["--preset", "mtnlg-530b", "--nodes", "4"], "fits nowhere"),
    (["--preset", "mtnlg-530b", "--nodes", "139"], "no valid layout"),
    (["--preset", "mtnlg-530b", "--nodes", "280", "--tp", "4", "--pp", "5"], "not divisible by micro_batch x dp"),
    (["--preset", "mtnlg-530b", "--nodes", "280", "--tp", "8", "--pp", "35", "--dp", "4"], "cluster has"),
    (["--preset", "mtnlg-530b", "--nodes", "0"], "cluster.nodes"),
])
def test_cli_impossible_requests_exit_nonzero(argv, msg, capsys):
    rc, out, err = run_main(argv, capsys)
    assert rc == 2 and msg in err and out == ""

def test_cli_layout_that_does_not_fit_exits_1(capsys):
    rc, out, err = run_main(["--preset", "mtnlg-530b", "--nodes", "140", "--tp", "8", "--pp", "7", "--recompute", "none"], capsys)
    assert rc == 1 and "DOES NOT FIT" in out and "does not fit" in err

def test_console_script():
    exe = Path(sys.executable).parent / "mtnlg"              # the environment running the tests, wherever it is
    out = subprocess.run([str(exe), "plan", *ISSUE_EXAMPLE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["layout"]["pp"] == 35

@pytest.mark.parametrize("L,pp", [(10, 4), (7, 3), (5, 4), (4, 4), (105, 35), (105, 28)])
def test_stage_layers_match_deepspeed_type_block_partition(L, pp):
    "DeepSpeed's `type:Block` partition (embedding, L blocks, final norm, loss head) puts blocks where stage_layers says."
    from deepspeed.runtime.utils import partition_balanced
    w = [0] + [1] * L + [0, 0]
    parts = partition_balanced(w, pp)
    assert [sum(w[parts[i]:parts[i + 1]]) for i in range(pp)] == P.stage_layers(L, pp)

@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_slice_matches_the_model_sharding(tp):
    "Parameters per GPU under TP (pp=1) equal the sizes of this project's own `mtnlg.model.shard` slices, every rank."
    import torch
    from mtnlg.model import full_shapes, shard
    cfg = load_config("tiny", overrides=dict(tp=tp, heads=4, hidden=64, vocab=1000))
    for r in range(tp):
        n = sum(shard(name, torch.zeros(shape), cfg.model, tp, r).numel() for name, shape in full_shapes(cfg.model).items())
        assert n == P.stage_params(cfg)[0]


@pytest.mark.parametrize("sets, says", [
    (["parallel.checkpoint_activations=3"], "not DeepSpeed's chunks of 3 blocks"),
    (["parallel.checkpoint_activations=2"], "not DeepSpeed's chunks of 2 blocks"),
    (["parallel.zero_stage=0", "precision=fp32"], "fp32 runs through DeepSpeed's ZeRO-1 optimizer only"),
    (["parallel.one_pass_loss=true"], "parallel.one_pass_loss=True: the planner counts memory only at False"),
    (["compile=true"], "compile=True"),
    (["parallel.partition_method=uniform"], "parallel.partition_method='uniform'"),
])
def test_plan_refuses_in_one_line_what_it_does_not_count(sets, says, capsys):
    "A setting whose memory the planner does not count: one line naming it and `--fake-run`, no number (exit 2)."
    argv = ["--preset", "mtnlg-530b", "--tp", "8", "--pp", "35"] + [a for s in sets for a in ("--set", s)]
    rc, out, err = run_main(argv, capsys)
    assert rc == 2 and says in err and "--fake-run" in err and len(err.strip().splitlines()) == 1 and out == "", err
    rc, out, _ = run_main(["--preset", "mtnlg-530b", "--tp", "8", "--pp", "35"], capsys)   # the control: counted
    assert rc == 0 and "fits" in out


def test_fits_only_with_the_planners_tolerance_to_spare(capsys):
    """'fits' keeps the planner's 1% tolerance above its peak, inside the memory left after the stated reserve: a GPU
    whose usable memory is the peak exactly does not fit; 1% more than that does (the control)."""
    cfg, cl = load_config("mtnlg-530b"), P.get_cluster(nodes=280)
    peak = P.evaluate(cfg, cl)["peak_bytes_per_gpu"]
    tight = P.get_cluster(nodes=280, memory_reserve=0.0, gpu_memory_bytes=int(peak) + 1)
    roomy = P.get_cluster(nodes=280, memory_reserve=0.0, gpu_memory_bytes=int(peak * (1 + P.PLAN_TOLERANCE)) + 1)
    assert not P.evaluate(cfg, tight)["fits"] and P.evaluate(cfg, roomy)["fits"]
    assert P.evaluate(cfg, cl)["plan_tolerance"] == 0.01 and cl.memory_reserve == 0.1


def test_planner_reads_the_reduce_bucket_of_the_deepspeed_config_the_project_builds():
    "fp32 goes through DeepSpeed's ZeRO-1 optimizer: its two reduce buckets are the size the built config gives."
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from mtnlg.pipeline import deepspeed_config
    cfg = load_config("tiny")
    ds = deepspeed_config(cfg)
    size = DeepSpeedZeroConfig(**ds["zero_optimization"]).reduce_bucket_size
    assert size == P.REDUCE_BUCKET_ELEMENTS
    assert P.rank_model_states(cfg, 0, ds)["buckets"] == 2 * 4 * size
    small = dict(ds, zero_optimization=dict(ds["zero_optimization"], reduce_bucket_size=1000))
    assert P.rank_model_states(cfg, 0, small)["buckets"] == 8000          # the control: read, not a constant
    assert P.rank_memory(cfg, 0)["total"] > 4e9 > P.rank_memory(cfg, 0, ds_config=small)["total"]
