"""Parameter and FLOP accounting against the chapter's worked numbers, against counts made another way
(Hugging Face's models, the meta-device tensors), and against torch's FlopCounterMode."""

import json

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from lumen import GPT, PRESETS, ModelConfig
from lumen.accounting import count, count_module, formula, forward_flops_per_token, report, training_flops
from lumen.cli import main
from lumen.formats.hf import ARCHITECTURES, config_to_hf
from lumen.model import plain_attention


def test_gpt2_small_has_85M_non_embedding_parameters():
    cfg = ModelConfig.from_name("gpt2")
    assert round(formula(cfg).non_embedding / 1e6) == 85  # 12 layers x 12 d^2
    assert round(count(cfg).non_embedding / 1e6) == 85  # the real tensors, biases and norms included
    f = formula(cfg)
    assert (f.attention, f.mlp, f.block) == (4 * 768**2, 8 * 768**2, 12 * 768**2)


def test_training_flops_worked_examples():
    assert f"{training_flops(85e6, 10e9):.0e}" == "5e+18"
    assert f"{training_flops(70e9, 15e12):.0e}" == "6e+24"


def test_llama3_70b_attention_is_2_25_d_squared():
    cfg = ModelConfig.from_name("llama3-70b")
    assert formula(cfg).attention / cfg.d_model**2 == pytest.approx(2.25)
    # SwiGLU: 3 d d_ff; the 70B model is about 70B parameters in all
    assert formula(cfg).mlp == 3 * 8192 * 28672
    assert count(cfg).total / 1e9 == pytest.approx(70.6, abs=0.1)


def test_swiglu_with_8_3_d_is_about_8_d_squared():
    d = 768
    cfg = ModelConfig(d_model=d, n_heads=12, mlp="swiglu", d_ff=8 * d // 3, norm="rmsnorm", positions="rope")
    assert formula(cfg).mlp / d**2 == pytest.approx(8.0, rel=0.01)


def test_attention_core_is_about_20_percent_for_gpt2_small():
    r = report(ModelConfig.from_name("gpt2"), 1024)
    assert 0.18 < r["attention_core_share"] < 0.25
    # ... and it dominates at long context
    assert report(ModelConfig.from_name("gpt2"), 32768)["attention_core_share"] > 1


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "llama3-70b"])
def test_exact_count_equals_hugging_face(name):
    """The same config built as a transformers model (on the meta device) has the same parameter count."""
    cfg = ModelConfig.from_name(name)
    hf_cfg = config_to_hf(cfg)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf_cfg))
    assert type(hf).__name__ == ARCHITECTURES[hf_cfg["model_type"]]
    assert sum(p.numel() for p in hf.parameters()) == count(cfg).total


def test_smollm2_total_is_the_published_count():
    assert count(ModelConfig.from_name("smollm2-135m")).total == 134_515_008


def test_count_module_equals_counting_parameters():
    model = GPT(ModelConfig(vocab_size=100, context=32, d_model=64, n_layers=3, n_heads=4, tie_embeddings=False))
    c = count_module(model)
    assert c.total == sum(p.numel() for p in model.parameters())
    assert c.unembedding == 100 * 64 and c.positions == 32 * 64


@pytest.mark.parametrize("kw", [dict(), dict(mlp="swiglu", norm="rmsnorm", positions="rope", n_kv_heads=2, bias=False)])
def test_flops_formula_matches_flop_counter(kw):
    """2 x matmul weights per token + 4 L d per layer, against FlopCounterMode on the readable attention
    path (the fused CPU kernel is not counted by FlopCounterMode); backward costs ~2x forward."""
    cfg = ModelConfig(vocab_size=256, context=64, d_model=64, n_layers=2, n_heads=4, **kw)
    model = GPT(cfg)
    idx = torch.randint(0, 256, (2, 64))
    with plain_attention(model):
        with FlopCounterMode(display=False) as fwd:
            model(idx)
        with FlopCounterMode(display=False) as both:
            model(idx, idx)[1].backward()
    assert fwd.get_total_flops() == forward_flops_per_token(cfg, 64)["total"] * idx.numel()
    assert both.get_total_flops() / fwd.get_total_flops() == pytest.approx(3.0, rel=0.02)


def test_count_cli(capsys, tmp_path):
    assert main(["count", "smollm2-135m", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["exact"]["total"] == count(ModelConfig.from_name("smollm2-135m")).total
    assert main(["count", "gpt2"]) == 0
    assert "12.00d^2" in capsys.readouterr().out
    path = tmp_path / "cfg.json"
    ModelConfig.from_name("baby-llama").save(path)
    assert main(["count", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exact"]["total"] == count(ModelConfig.from_name("baby-llama")).total
    assert main(["count", "gpt5"]) == 2
    assert "unknown model 'gpt5' (did you mean gpt2?): give a preset (gpt2" in capsys.readouterr().err
