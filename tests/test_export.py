"""HF export/import: logits of the exported transformers model equal the project's on real text (fp32)."""
import json
import pytest
import torch
from mtnlg import export as ex
from mtnlg.config import ModelConfig, ParallelConfig, RunConfig, save_config
from mtnlg.data import get_tokenizer
from mtnlg.model import GPT, init_full_state, load_full_state
from mtnlg.topology import init_distributed

@pytest.fixture(scope="module")
def text_ids(shared_data):
    text = (shared_data / "corpus" / "gutenberg" / "melville-moby_dick.txt").read_text()[10000:20000]
    ids = get_tokenizer("gpt2").tokenize(text)
    return torch.tensor([ids[:96], ids[96:192]])

@pytest.mark.parametrize("tie", [True, False])
def test_export_logits_match(tmp_path, text_ids, tie):
    from transformers import GPT2LMHeadModel
    cfg = ModelConfig(num_layers=3, hidden_size=48, num_heads=4, seq_length=96, hidden_dropout=0, attention_dropout=0,
                      tie_embeddings=tie)
    full = init_full_state(cfg, seed=11)
    init_distributed(ParallelConfig())
    gpt = load_full_state(GPT(cfg), full, cfg).eval()
    ex.save_hf(full, cfg, tmp_path / "hf")
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "hf").iterdir()}
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        a, b = gpt(text_ids), hf(input_ids=text_ids).logits
    assert a.shape == b.shape == (2, 96, 50257) and (a - b).abs().max().item() < 1e-4
    # the comparison can fail: a model with one swapped weight (q <-> k rows of layer 0) differs
    bad = dict(full); w = bad["blocks.0.attn.qkv.weight"].clone(); h = cfg.hidden_size
    w[:h], w[h:2 * h] = full["blocks.0.attn.qkv.weight"][h:2 * h], full["blocks.0.attn.qkv.weight"][:h]
    bad["blocks.0.attn.qkv.weight"] = w
    ex.save_hf(bad, cfg, tmp_path / "hf_bad")
    with torch.no_grad(): c = GPT2LMHeadModel.from_pretrained(tmp_path / "hf_bad").eval()(input_ids=text_ids).logits
    assert (a - c).abs().max().item() > 1e-3
    cfg2, full2 = ex.load_hf(tmp_path / "hf")
    assert cfg2 == cfg and all(torch.equal(full2[k], full[k]) for k in full)

def test_import_hf_gpt2_into_project_model(tmp_path, text_ids):
    "An HF GPT-2 (its own random init, gelu) imported into GPT gives the same logits."
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, activation_function="gelu",
                                    resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)).eval()
    hf.save_pretrained(tmp_path / "src")
    ck = ex.import_hf(tmp_path / "src", tmp_path / "run")
    from mtnlg.eval import load_model_for_eval
    sc, found = load_model_for_eval(tmp_path / "run")
    assert found == ck
    gpt = sc.fn.__self__
    with torch.no_grad(): a, b = gpt(text_ids), hf(input_ids=text_ids).logits
    assert (a - b).abs().max().item() < 1e-4

def test_export_run_and_cli(tmp_path, text_ids):
    from mtnlg.cli import main
    cfg = ModelConfig(num_layers=2, hidden_size=32, num_heads=4, seq_length=64, hidden_dropout=0, attention_dropout=0)
    run = tmp_path / "run"
    save_config(RunConfig(model=cfg), run / "config.json")
    for step, seed in ((5, 1), (20, 2)):     # the newest step is exported
        (run / "checkpoints" / f"step_{step}").mkdir(parents=True)
        torch.save({"model": init_full_state(cfg, seed)}, run / "checkpoints" / f"step_{step}" / "full_state.pt")
    assert main(["export", "--checkpoint", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    _, full = ex.load_hf(tmp_path / "hf")
    assert torch.equal(full["blocks.1.mlp.fc1.weight"], init_full_state(cfg, 2)["blocks.1.mlp.fc1.weight"])
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert main(["export", "--import-hf", str(tmp_path), "--out", str(tmp_path / "r2")]) == 2
