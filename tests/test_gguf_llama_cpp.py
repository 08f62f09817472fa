"""GGUF files written by llama.cpp's own converter (convert_hf_to_gguf.py, from the llama-cpp-python sdist on
PyPI: tests/helpers/llama_cpp.py) from tiny random-weight Hugging Face models: lumen's reading of the file gives
transformers' logits on the original weights. Slow tier: each conversion starts the converter (~5 s)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from helpers.llama_cpp import convert
from lumen.formats import load
from lumen.formats.gguf import GGUFError, read_gguf

pytestmark = pytest.mark.slow

V = 300  # at least the helper tokenizer's 264 tokens (helpers.gguf.TOKENS)
SHAPE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
MODELS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, rope_theta=50000.0)),
    "llama-tied-mha": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE | dict(num_key_value_heads=4),
                                                           tie_word_embeddings=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, rope_theta=1e6)),
    "qwen2-tied": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True)),
    "gemma-wide-heads": lambda: GemmaForCausalLM(GemmaConfig(**SHAPE | dict(num_key_value_heads=1), head_dim=32)),
}
IDS = torch.tensor([[5, 70, 3, 200, 17, 17, 99, 250, 1, 42, 8, 130, 263, 7]])
# the noise floors: float32 files must agree to float32 rounding; a float16 file's weights are rounded to 11 bits,
# a q8_0 file's to 8 bits per block of 32 (measured on these models: ~1e-3 and ~1e-2 relative)
TOLERANCE = {"f32": 5e-5, "f16": 5e-3, "q8_0": 5e-2}


def relative(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


def hf_dir(tmp_path, kind: str):
    torch.manual_seed(hash(kind) % 1000)
    model = MODELS[kind]().eval()
    with torch.no_grad():  # norms away from their initial values, so a dropped or unfolded gain would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5) if isinstance(model, GemmaForCausalLM) else p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / kind)
    return model, tmp_path / kind


@pytest.mark.parametrize("kind", MODELS)
def test_converted_file_gives_transformers_logits(tmp_path, kind):
    model, directory = hf_dir(tmp_path, kind)
    path = convert(directory, tmp_path / f"{kind}.gguf")
    loaded = load(str(path)).model
    with torch.no_grad():
        ref = model(IDS).logits
        ours, _ = loaded(IDS)
    assert relative(ours, ref) < TOLERANCE["f32"], relative(ours, ref)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_converted_quantized_file_within_its_rounding(tmp_path, outtype):
    model, directory = hf_dir(tmp_path, "qwen2")
    path = convert(directory, tmp_path / f"qwen2-{outtype}.gguf", outtype)
    loaded = load(str(path)).model
    with torch.no_grad():
        err = relative(loaded(IDS)[0], model(IDS).logits)
    assert 0 < err < TOLERANCE[outtype], err  # (0: the file really is rounded)


def test_mistral_converts_to_llama_and_loads(tmp_path):
    """llama.cpp writes a Mistral as architecture "llama" (its W_Q/W_K permuted): lumen reads it exactly."""
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SHAPE))
    model.save_pretrained(tmp_path / "mistral")
    path = convert(tmp_path / "mistral", tmp_path / "mistral.gguf")
    with torch.no_grad():
        assert relative(load(str(path)).model(IDS)[0], model(IDS).logits) < TOLERANCE["f32"]


def test_llama3_rope_freqs_is_read_not_ignored(tmp_path):
    """Llama 3.1+'s rescaled RoPE reaches the file as the tensor rope_freqs.weight: it must change the model
    (here: a refusal naming it) rather than be dropped."""
    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters=rope)).save_pretrained(tmp_path / "llama3")
    path = convert(tmp_path / "llama3", tmp_path / "llama3.gguf")
    with pytest.raises(GGUFError, match="rope_freqs.weight"):
        read_gguf(path)
