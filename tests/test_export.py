"""HF export/import, streamed block by block: logits of the exported transformers model equal the project's on real
text (fp32), and an HF GPT-2 imported into a checkpoint gives transformers' logits."""
import pytest
import torch
from mtnlg import export as ex
from mtnlg.checkpoint import write_weights, load_weights
from mtnlg.config import ModelConfig, ParallelConfig, RunConfig
from mtnlg.tokenizer import get_tokenizer
from mtnlg.model import GPT, init_full_state
from mtnlg.topology import init_distributed


@pytest.fixture(scope="module")
def text_ids(fixture_data):
    text = (fixture_data / "corpus" / "gutenberg" / "melville-moby_dick.txt").read_text()[10000:20000]
    ids = get_tokenizer("gpt2").tokenize(text)
    return torch.tensor([ids[:96], ids[96:192]])


def _checkpoint(run, cfg, full, step=3):
    "A run's checkpoint folder holding the tensors of `full` (as training or an import writes one)."
    return write_weights(run / "checkpoints" / f"step{step:08d}", RunConfig(model=cfg), lambda n: full[n])


@pytest.mark.parametrize("tie,act", [(True, "gelu_tanh"), (False, "gelu")])
def test_export_logits_match(tmp_path, text_ids, tie, act):
    from transformers import GPT2LMHeadModel
    cfg = ModelConfig(num_layers=3, hidden_size=48, num_heads=4, seq_length=96, hidden_dropout=0, attention_dropout=0,
                      tie_embeddings=tie, activation=act)
    full = init_full_state(cfg, seed=11)
    init_distributed(ParallelConfig())
    ck = _checkpoint(tmp_path / "run", cfg, full)
    gpt = load_weights(GPT(cfg), ck, cfg).eval()
    out = ex.export_run(tmp_path / "run", tmp_path / "hf", dtype="fp32")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors.index.json", "vocab.json", "merges.txt"} <= names
    assert len([n for n in names if n.endswith(".safetensors")]) == cfg.num_layers + 2     # one shard per block
    hf = GPT2LMHeadModel.from_pretrained(out).eval()
    assert hf.config.activation_function == ("gelu_new" if act == "gelu_tanh" else "gelu")
    with torch.no_grad():
        a, b = gpt(text_ids), hf(input_ids=text_ids).logits
    assert a.shape == b.shape == (2, 96, 50257) and (a - b).abs().max().item() < 1e-4
    # the comparison can fail: a model with one swapped weight (q <-> k rows of layer 0) differs
    bad = dict(full); w = bad["blocks.0.attn.qkv.weight"].clone(); h = cfg.hidden_size
    w[:h], w[h:2 * h] = full["blocks.0.attn.qkv.weight"][h:2 * h], full["blocks.0.attn.qkv.weight"][:h]
    bad["blocks.0.attn.qkv.weight"] = w
    _checkpoint(tmp_path / "bad", cfg, bad)
    ex.export_run(tmp_path / "bad", tmp_path / "hf_bad", dtype="fp32")
    with torch.no_grad(): c = GPT2LMHeadModel.from_pretrained(tmp_path / "hf_bad").eval()(input_ids=text_ids).logits
    assert (a - c).abs().max().item() > 1e-3
    cfg2, full2 = ex.load_hf(out)
    assert cfg2 == cfg and all(torch.equal(full2[k], full[k]) for k in full)


@pytest.mark.parametrize("act", ["gelu_new", "gelu"])
def test_import_hf_gpt2_into_project_model(tmp_path, text_ids, act):
    "An HF GPT-2 (its own random init) imported into a checkpoint: the project's GPT gives transformers' logits."
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, activation_function=act,
                                    resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)).eval()
    hf.save_pretrained(tmp_path / "src", max_shard_size="100KB")        # sharded safetensors with an index
    assert len(list((tmp_path / "src").glob("*.safetensors"))) > 1
    ck = ex.import_hf(tmp_path / "src", tmp_path / "run")
    from mtnlg.eval import load_model_for_eval
    sc, found = load_model_for_eval(tmp_path / "run")
    assert found == ck
    gpt = sc.fn.__self__
    with torch.no_grad(): a, b = gpt(text_ids), hf(input_ids=text_ids).logits
    assert (a - b).abs().max().item() < 1e-5
    with pytest.raises(ex.ExportError, match="exists and is not empty"): ex.import_hf(tmp_path / "src", tmp_path / "run")


def test_import_hf_checks_shapes_first_and_a_killed_import_does_not_block(tmp_path):
    "Weights whose shapes the config does not imply fail before any write; a killed import's leftovers are redone."
    import json, shutil
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, n_positions=64)).save_pretrained(tmp_path / "src")
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "src", bad)
    hf_cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**hf_cfg, "n_positions": 32}))
    with pytest.raises(ex.ExportError, match=r"wpe.weight has shape \[64, 32\] where its config.json implies \[32, 32\]"):
        ex.import_hf(bad, tmp_path / "run")
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.importing").exists()
    left = tmp_path / "run.importing" / "checkpoints" / "step_00000000"      # what a kill mid-write leaves
    left.mkdir(parents=True)
    (left / "__0_0.distcp").write_bytes(b"half")
    (tmp_path / "run").mkdir()                                              # an empty target folder is fine
    ck = ex.import_hf(tmp_path / "src", tmp_path / "run")
    assert (ck / "COMPLETE").exists() and (tmp_path / "run" / "config.json").exists()
    assert not (tmp_path / "run.importing").exists()


def test_export_run_and_cli(tmp_path):
    from mtnlg.cli import main
    cfg = ModelConfig(num_layers=2, hidden_size=32, num_heads=4, seq_length=64, hidden_dropout=0, attention_dropout=0)
    run = tmp_path / "run"
    for step, seed in ((5, 1), (20, 2)):                     # the newest step (`latest`) is exported
        _checkpoint(run, cfg, init_full_state(cfg, seed), step)
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 0
    cfg2, full = ex.load_hf(tmp_path / "hf")
    want = init_full_state(cfg, 2)["blocks.1.mlp.fc1.weight"]
    assert torch.equal(full["blocks.1.mlp.fc1.weight"], want.bfloat16().float())        # bf16 by default
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert main(["export", "--import-hf", str(tmp_path), "--out", str(tmp_path / "r2")]) == 2
    (run / "checkpoints" / "step00000020" / ".metadata").unlink()                    # a damaged checkpoint
    assert main(["export", "--checkpoint", str(run / "checkpoints" / "step00000020"), "--out", str(tmp_path / "y")]) == 2
