"""Issue 41's switches of the training step, each proven on the CPU against the path it replaces (the control)."""
import collections, os
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

os.environ.setdefault("DS_ACCELERATOR", "cpu")


class OpCount(TorchDispatchMode):
    "Counts the aten ops run inside the block, by name."
    def __init__(self):
        super().__init__()
        self.n = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def world():
    "A one-process world (tp=1) and the tiny preset's model config."
    from mtnlg.config import load_config, ParallelConfig
    from mtnlg.topology import init_distributed, shutdown
    topo = init_distributed(ParallelConfig())
    yield load_config("tiny").model
    shutdown()


def block_step(cfg, seed=0, **switches):
    "(output, [input grad] + parameter grads, forward ops, backward ops) of one fp32 block with random weights."
    from mtnlg.config import ParallelConfig
    from mtnlg.model import Block
    block = Block(cfg, 0, ParallelConfig(**switches)).train()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters(): p.copy_(torch.randn(p.shape, generator=g) * 0.1)   # biases not zero
    x = torch.randn(2, cfg.seq_length, cfg.hidden_size, generator=g).requires_grad_()
    with OpCount() as fwd: y = block(x)
    with OpCount() as bwd: y.backward(torch.ones_like(y))
    return y.detach(), [x.grad] + [p.grad for p in block.parameters()], fwd.n, bwd.n


def test_bias_in_gemm_one_addmm_per_linear(world):
    "tp=1: the four biases go inside the GEMMs (addmm 4, adds 6 -> 2 forward); outputs and gradients equal."
    y0, g0, fwd0, bwd0 = block_step(world)                       # the control: megatron-core's layers
    y1, g1, fwd1, bwd1 = block_step(world, bias_in_gemm=True)
    assert (fwd0["add"], fwd0["addmm"]) == (6, 0), fwd0
    assert (fwd1["add"], fwd1["addmm"]) == (2, 4), fwd1          # only the two residual adds are left
    work = lambda n: [n[k] for k in ("mm", "sum", "add", "stack")]
    assert fwd1["mm"] == 0 and work(bwd1) == work(bwd0) == [8, 4, 2, 1], (bwd0, bwd1)   # backward: the same work
    assert (y0 - y1).abs().max() <= 1e-6
    assert max((a - b).abs().max() for a, b in zip(g0, g1)) <= 1e-6


def test_bias_in_gemm_is_off_at_tp_above_one(world):
    "The switch reads the tensor-parallel size: at tp > 1 megatron-core's layers stay (their all-reduce needs it)."
    from mtnlg.config import ParallelConfig
    from mtnlg.model import Attention, MLP
    on = ParallelConfig(bias_in_gemm=True)
    assert Attention(world, on).bias_in_gemm and MLP(world, on).bias_in_gemm
    assert not Attention(world).bias_in_gemm                      # off by default


def profiled(fn):
    "(peak bytes allocated above the start, Counter of aten ops) of `fn()`, from torch's profiler (compiled code too)."
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p: fn()
    events = p.profiler.kineto_results.events()
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    return peak, collections.Counter(e.name() for e in events if e.name().startswith("aten::"))


def loss_and_grad(z, labels, vocab, one_pass):
    "(loss, d loss / d logits) of `lm_loss` on logits `z` [N, n] and the op profile of forward and backward."
    from mtnlg.model import lm_loss
    x = z.clone().requires_grad_()
    def step():
        x.grad = None
        loss = lm_loss(x[None], labels[None], vocab, one_pass)
        loss.backward()
        return loss
    step()                                                       # compiles the one-pass kernels for these shapes
    peak, ops = profiled(step)
    return step().detach(), x.grad, peak, ops


def logits_and_labels(rows, n=1024, vocab=1000, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, n, generator=g) * 3).to(dtype), torch.randint(0, vocab, (rows,), generator=g)


def test_one_pass_loss_equals_the_blocks(world, monkeypatch):
    "fp32: loss and gradients within 1e-6 of the blocked loss (the control); bf16 within its rounding."
    import mtnlg.model as M
    monkeypatch.setattr(M, "CE_BLOCK", 4 * 1024)                  # the control in blocks of 4 rows
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2e-3)):
        z, lab = logits_and_labels(64, dtype=dtype)
        old, new = loss_and_grad(z, lab, 1000, False), loss_and_grad(z, lab, 1000, True)
        assert abs(old[0] - new[0]) <= 1e-6 * abs(old[0]), (dtype, old[0], new[0])
        assert new[1].dtype == dtype and not new[1][:, 1000:].any()  # padded columns: no gradient
        assert (old[1].float() - new[1].float()).abs().max() <= tol, dtype


def test_one_pass_loss_copies_constant_and_memory(world, monkeypatch):
    "bf16: copies O(blocks) -> O(1); peak memory of forward + backward: the gradient alone (the control: ~2x)."
    import mtnlg.model as M
    monkeypatch.setattr(M, "CE_BLOCK", 4 * 1024)
    copies = lambda ops: ops["aten::copy_"] + ops["aten::_to_copy"]
    runs = {(rows, one): loss_and_grad(*logits_and_labels(rows, dtype=torch.bfloat16), 1000, one)
            for rows in (64, 256) for one in (False, True)}
    assert copies(runs[256, False][3]) > copies(runs[64, False][3]) + 50        # one or more per block of rows
    assert copies(runs[256, True][3]) == copies(runs[64, True][3]) <= 8
    grad_bytes = 256 * 1024 * 2
    assert runs[256, True][2] <= 1.1 * grad_bytes < 1.8 * grad_bytes <= runs[256, False][2], \
        (runs[256, True][2], runs[256, False][2])


def _tp2_loss(rank, port, out):
    "Rank `rank` of a 2-process tp=2 world: one-pass loss and this rank's logits gradient, saved to out/rank.pt."
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.compiler.set_stance("force_eager")   # the kernels' Python bodies run as written (no compile in 2 processes)
    from mtnlg.config import ParallelConfig
    from mtnlg.model import lm_loss
    from mtnlg.topology import init_distributed, shutdown
    init_distributed(ParallelConfig(tp=2))
    z, lab = logits_and_labels(32, n=1024, vocab=1000)                   # the full padded vocabulary, split in 2
    x = z.chunk(2, 1)[rank].clone().requires_grad_()
    loss = lm_loss(x[None], lab[None], 1000, one_pass=True)
    loss.backward()
    torch.save((loss.detach(), x.grad), f"{out}/{rank}.pt")
    shutdown()


def test_one_pass_loss_at_tp2(tmp_path):
    "tp=2 (the all-reduces outside the kernels, sums rescaled to the global max) = the full vocabulary's CE."
    import torch.multiprocessing as mp
    from conftest import free_port
    mp.start_processes(_tp2_loss, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    (l0, g0), (l1, g1) = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
    z, lab = logits_and_labels(32, n=1024, vocab=1000)
    ref_in = z[:, :1000].clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_in, lab)
    ref.backward()
    assert l0 == l1 and abs(l0 - ref) <= 1e-6
    assert (torch.cat([g0, g1], 1)[:, :1000] - ref_in.grad).abs().max() <= 1e-7 and not g1[:, 1000 - 512:].any()


class HostReads(TorchDispatchMode):
    "Host reads of tensor values (`.item()`, `bool()`, `float()`: _local_scalar_dense); elements zeroed."
    def __init__(self):
        super().__init__()
        self.n, self.zeroed = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is torch.ops.aten._local_scalar_dense.default
        if func is torch.ops.aten.zero_.default: self.zeroed += args[0].numel()
        if func is torch.ops.aten._foreach_zero_.default: self.zeroed += sum(t.numel() for t in args[0])
        return func(*args, **(kwargs or {}))


def engine_steps(sync_free, nan_at=2, steps=5, frozen_at=3, lean=True):
    """(losses, host reads per train_batch, norms, skipped steps, final weights, elements zeroed per train_batch,
    the fp32 gradients' size, the frozen weight's) of the bf16 engine, NaN at `nan_at`, a layer norm's weight frozen
    at `frozen_at` only; `lean=False`: DeepSpeed's own gradient moves and clears."""
    from mtnlg.config import load_config
    from mtnlg.model import init_parameters
    from mtnlg.patches import lean_bf16_grads
    from mtnlg.pipeline import build_pipeline, build_engine
    from mtnlg.topology import init_distributed
    ov = {"precision": "bf16", "optim.global_batch": 2, "parallel.micro_batch": 2, "optim.grad_clip": 0.05,
          "parallel.sync_free_step": sync_free}                       # a clip of 0.05: every step clips
    cfg = load_config("tiny", overrides=ov)
    topo = init_distributed(cfg.parallel, run_cfg=cfg)
    module = init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed)
    engine = build_engine(cfg, topo, module, grad_accum=1)
    lean_bf16_grads(engine, on=lean)
    g, loss_fn, out = torch.Generator().manual_seed(0), engine.module.loss_fn, ([], [], [], [])
    frozen = next(p for n, p in module.named_parameters() if ".ln1." in n)    # no gradient at `frozen_at`
    for step in range(steps):
        x = torch.randint(0, 1000, (2, cfg.model.seq_length + 1), generator=g)
        if step == nan_at: engine.module.loss_fn = lambda a, b: loss_fn(a, b) * float("nan")   # a planted NaN
        frozen.requires_grad_(step != frozen_at)
        with HostReads() as reads: loss = engine.train_batch(iter([(x[:, :-1].contiguous(), x[:, 1:].contiguous())]))
        engine.module.loss_fn = loss_fn
        for acc, v in zip(out, (float(loss), reads.n, float(engine.get_global_grad_norm()), reads.zeroed)):
            acc.append(v)
    sizes = sum(f.numel() for f in engine.optimizer.fp32_groups_gradients_flat)
    return (*out[:3], engine.skipped_steps, [p.detach().clone() for p in module.parameters()], out[3], sizes,
            frozen.numel())


ENGINE_RUNS = {}

def engine_steps_once(*args, **kw):
    "`engine_steps` of these arguments, run once in this module (two tests read the same runs; none changes them)."
    key = (args, tuple(sorted(kw.items())))
    if key not in ENGINE_RUNS: ENGINE_RUNS[key] = engine_steps(*args, **kw)
    return ENGINE_RUNS[key]


def test_sync_free_step_reads_the_host_once(world):
    "bf16 step: host reads 2 -> 1 (the skip flag, at the end); losses, norms and weights bit-equal; NaN skipped."
    old, new = engine_steps_once(False), engine_steps_once(True)      # the control: DeepSpeed's own step
    assert old[1] == [2, 2, 1, 2, 2] and new[1] == [1] * 5, (old[1], new[1])   # (a NaN step stops after one read)
    assert old[0][:2] + old[0][3:] == new[0][:2] + new[0][3:] and old[2] == new[2], (old, new)
    assert old[3] == new[3] == 1 and new[2][2] == float("inf")       # the planted NaN: skipped and counted
    assert all(torch.equal(a, b) for a, b in zip(old[4], new[4]))
    clean = engine_steps(True, nan_at=-1)                              # control: without the NaN the weights differ
    assert clean[3] == 0 and not all(torch.equal(a, b) for a, b in zip(clean[4], new[4]))


def test_no_gradient_is_zeroed_twice(world, monkeypatch):
    "DeepSpeed clears the fp32 gradients twice a step; lean_bf16_grads only the slices no backward wrote."
    import mtnlg.patches
    old, new = engine_steps(False, lean=False), engine_steps_once(True)   # a layer norm frozen at step 3 in both
    size, frozen = old[6], old[7]
    assert old[5][:2] == [2 * size] * 2 and min(old[5]) >= 2 * size, (old[5], size)   # step's end, zero_grad
    assert new[5] == [0, 0, 0, frozen, 0], new[5]                     # the frozen weight's slice, before its sum
    assert all(torch.equal(a, b) for a, b in zip(old[4], new[4]))     # bit-equal weights, the frozen step included
    assert engine_steps_once(False)[5] == new[5]                      # DeepSpeed's step on lean gradients: the same
    monkeypatch.setattr(mtnlg.patches, "zero_ungraded", lambda opt: None)
    stale = engine_steps(True)                     # control: a stale slice is stepped (run anew: the patch is on)
    assert not all(torch.equal(a, b) for a, b in zip(old[4], stale[4]))


def compiled_step(cfg, layers, once, backend="eager", nested=True):
    "(frames compiled, graphs, parameter grads) of one forward + backward of a compiled GPT with dropout."
    import torch._dynamo
    from dataclasses import replace
    from torch._dynamo.utils import counters
    from mtnlg.config import ParallelConfig
    from mtnlg.model import GPT, compile_blocks, init_parameters
    from mtnlg.topology import seed_all
    m = replace(cfg, num_layers=layers, vocab_size=1000, attention_dropout=0.1, hidden_dropout=0.1)
    model = init_parameters(GPT(m, parallel=ParallelConfig(compile_once=once)), m, seed=1).train()
    if backend: compile_blocks(model, backend=backend, **({"dynamic": False} if once else {}))
    torch._dynamo.reset()
    counters.clear()
    seed_all(3)
    tokens = torch.randint(0, 1000, (2, m.seq_length), generator=torch.Generator().manual_seed(0))
    with torch._dynamo.config.patch(nested_graph_breaks=nested):
        model(tokens).float().pow(2).mean().backward()
    frames, graphs = counters["frames"]["total"], counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return frames, graphs, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("layers", [6, 24])
def test_compile_once_builds_one_block(world, layers):
    "compile_once: 2 frames and 2 graphs for all blocks (no recompile), with or without nested breaks; = eager."
    eager = compiled_step(world, layers, True, backend=None)
    for nested in (True, False):                     # dynamo's default (False) is what older torch versions do
        frames, graphs, grads = compiled_step(world, layers, True, nested=nested)
        assert (frames, graphs) == (2, 2), (layers, nested, frames, graphs)
        assert all(torch.equal(a, b) for a, b in zip(eager[2], grads))     # the eager masks and gradients
    assert compiled_step(world, layers, False)[0] > 2                 # control: dynamo traces into the RNG swap


def dropout_block_step(cfg, fused):
    "(output, input grad, aten ops) of one fp32 block with hidden dropout 0.1, the default RNG seeded the same."
    from dataclasses import replace
    from mtnlg.config import ParallelConfig
    from mtnlg.model import Block
    torch.manual_seed(0)
    block = Block(replace(cfg, hidden_dropout=0.1), 0, ParallelConfig(fused_dropout_add=fused)).train()
    with torch.no_grad():
        for p in block.parameters(): p.normal_(0, 0.1)
    x = torch.randn(2, cfg.seq_length, cfg.hidden_size).requires_grad_()
    def step():
        x.grad = None
        torch.manual_seed(5)
        y = block(x)
        y.sum().backward()
        return y.detach()
    step()                                                     # compiles the fused kernels
    _, ops = profiled(step)
    return step(), x.grad, ops


def test_fused_dropout_add(world, monkeypatch):
    "Dropout, scaling and residual add in one kernel; with torch's RNG (fallback_random) the eager masks exactly."
    import torch._dynamo
    import torch._inductor.config as inductor
    import mtnlg.model as M
    eager = dropout_block_step(world, False)                  # the control: nn.Dropout and an add
    fused = dropout_block_step(world, True)
    unfused = lambda ops: [ops[k] for k in ("aten::dropout", "aten::bernoulli_", "aten::mul", "aten::add")]
    assert unfused(eager[2]) == [2, 2, 4, 7] and unfused(fused[2]) == [0, 0, 0, 4], (eager[2], fused[2])
    assert not torch.equal(eager[0], fused[0])                 # inductor's own masks: other samples
    monkeypatch.setattr(inductor, "fallback_random", True)    # inductor draws with torch's RNG: eager's masks
    monkeypatch.setattr(M, "_COMPILED", {})
    torch._dynamo.reset()
    same = dropout_block_step(world, True)
    torch._dynamo.reset()
    assert torch.equal(eager[0], same[0]) and torch.equal(eager[1], same[1])


def test_set_switches_on_a_built_engine(world):
    "One engine, its switches turned on and off again in place (the GPU ladder's rungs): each step still trains."
    from mtnlg.config import load_config
    from mtnlg.model import Block, init_parameters
    from mtnlg.pipeline import build_pipeline, build_engine, set_switches
    from mtnlg.topology import init_distributed
    cfg = load_config("tiny", overrides={"precision": "bf16", "optim.global_batch": 2, "parallel.micro_batch": 2})
    topo = init_distributed(cfg.parallel, run_cfg=cfg)
    engine = build_engine(cfg, topo, init_parameters(build_pipeline(cfg, topo), cfg.model, cfg.seed), grad_accum=1)
    blocks = [m for m in engine.module.modules() if isinstance(m, Block)]
    x = torch.randint(0, 1000, (2, cfg.model.seq_length + 1), generator=torch.Generator().manual_seed(0))
    step = lambda: float(engine.train_batch(iter([(x[:, :-1].contiguous(), x[:, 1:].contiguous())])))
    on = dict(bias_in_gemm=True, one_pass_loss=True, sync_free_step=True)
    losses = [step(), step()]
    set_switches(engine, type(cfg.parallel)(**on))
    assert all(b.attn.bias_in_gemm and b.mlp.bias_in_gemm for b in blocks) and engine.module.loss_fn.one_pass
    assert "step" in engine.optimizer.__dict__                          # the sync-free step, on this optimizer
    losses.append(step())
    set_switches(engine, type(cfg.parallel)(**{k: False for k in on}))
    assert not blocks[0].attn.bias_in_gemm and "step" not in engine.optimizer.__dict__
    losses.append(step())
    assert losses[0] > losses[1] > losses[2] > losses[3], losses       # the same batch: each step lowers its loss


def qkv_backward(split, consumer):
    "(the projection's gradient, the backward's aten ops) with q, k, v split off it by `split` and used by `consumer`."
    B, S, heads, hd = 2, 16, 4, 8
    qkv = torch.randn(B, S, 3 * heads * hd, generator=torch.Generator().manual_seed(0)).requires_grad_()
    y = consumer(*split(qkv, B, S, heads, hd))
    with OpCount() as ops: y.backward(torch.ones_like(y) / 2)
    return qkv.grad, ops.n


def test_packed_qkv_grad_hands_packed_gradients_back_uncopied(world):
    "q/k/v gradients that are slices of one buffer go back as that buffer (no stack); others are stacked; bit-equal."
    import torch.nn.functional as F
    from mtnlg.model import QKVHeads
    unbind = lambda qkv, B, S, heads, hd: [t.transpose(1, 2) for t in qkv.view(B, S, 3, heads, hd).unbind(2)]
    ours = lambda qkv, B, S, heads, hd: QKVHeads.apply(qkv, heads)
    w = torch.randn(2, 16, 3, 4, 8, generator=torch.Generator().manual_seed(1))
    # a consumer whose backward hands the gradients packed, as a GPU's memory-efficient attention does
    packed = lambda q, k, v: torch.stack([t.transpose(1, 2) for t in (q, k, v)], 2) * w
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)   # the CPU kernel: separate grads
    for consumer, stacks in ((packed, 0), (sdpa, 1)):
        (g0, ops0), (g1, ops1) = qkv_backward(unbind, consumer), qkv_backward(ours, consumer)   # control, ours
        assert torch.equal(g0, g1) and ops0["stack"] == 1 and ops1["stack"] == stacks, (ops0, ops1)
        assert ops1["clone"] + ops1["copy_"] + ops1["cat"] == 0


def test_packed_qkv_grad_block_equals(world):
    "A whole fp32 block with packed_qkv_grad (on the CPU: SDPA's gradients stacked as before) = the control."
    y0, g0, _, _ = block_step(world)
    y1, g1, _, bwd1 = block_step(world, packed_qkv_grad=True)
    assert torch.equal(y0, y1) and all(torch.equal(a, b) for a, b in zip(g0, g1)) and bwd1["stack"] == 1
