"""The families interpretability studies, against Hugging Face transformers on random weights: GPT-NeoX
(Pythia), Qwen2, Gemma and Mistral, several shapes each (GQA where the family has it). The residual stream
after every block and the logits agree to 1e-5, greedy decoding with the KV cache is token-identical to
transformers' generate, and a lumen model written as a HF directory loads in transformers."""

import json

import pytest
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lumen import GPT
from lumen.formats.hf import from_hf_model, load_hf_dir, save_hf_dir

V = 97
SHAPES = {
    "neox-parallel": lambda: GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=48, rotary_pct=0.25, hidden_act="gelu")),
    "neox-sequential-half": lambda: GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
        max_position_embeddings=48, rotary_pct=0.5, rotary_emb_base=1000, use_parallel_residual=False,
        hidden_act="gelu_new", tie_word_embeddings=True)),
    "qwen2-gqa": lambda: Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, rope_theta=100000.0)),
    "qwen2-tied-mha": lambda: Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=6, max_position_embeddings=48, tie_word_embeddings=True)),
    "gemma-mqa-wide-heads": lambda: GemmaForCausalLM(GemmaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=48)),
    "gemma-gqa-narrow-heads": lambda: GemmaForCausalLM(GemmaConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=48, hidden_act="gelu")),
    "mistral-window-5": lambda: MistralForCausalLM(MistralConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, sliding_window=5)),
    "mistral-window-12-mqa": lambda: MistralForCausalLM(MistralConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=48, sliding_window=12, tie_word_embeddings=True)),
}
HF_CLASSES = {"gpt_neox": GPTNeoXForCausalLM, "qwen2": Qwen2ForCausalLM, "gemma": GemmaForCausalLM,
              "mistral": MistralForCausalLM}


def _pair(name):
    torch.manual_seed(0)
    hf = SHAPES[name]().eval()
    hf.config._attn_implementation = "eager"
    with torch.no_grad():  # HF inits biases and norms to 0/1: randomise them so they are tested too
        for p in hf.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return hf, from_hf_model(hf)


def _streams(model: GPT, idx):
    out = []
    hooks = [b.register_forward_hook(lambda m, i, o: out.append(o)) for b in model.blocks]
    logits, _ = model(idx)
    for h in hooks:
        h.remove()
    return out, logits


@pytest.mark.parametrize("name", SHAPES)
def test_logits_and_residual_stream_agree(name):
    hf, ours = _pair(name)
    idx = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx, output_hidden_states=True)
        streams, logits = _streams(ours, idx)
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=0)
    hidden = ref.hidden_states  # embeddings, after block 0, ..., after the last block *and* the final norm
    torch.testing.assert_close(ours.embed(idx), hidden[0], atol=1e-5, rtol=0)
    for i, s in enumerate(streams[:-1]):
        torch.testing.assert_close(s, hidden[i + 1], atol=1e-5, rtol=0, msg=f"stream after block {i}")
    torch.testing.assert_close(ours.ln_f(streams[-1]), hidden[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", SHAPES)
def test_greedy_decode_agrees_with_hf_generate(name):
    hf, ours = _pair(name)
    prompt = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(2))
    ref = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None,
                      attention_mask=torch.ones_like(prompt))
    cached = ours.generate(prompt, 20, temperature=0)
    assert torch.equal(cached, ref)
    assert torch.equal(ours.generate(prompt, 20, temperature=0, use_cache=False), cached)


@pytest.mark.parametrize("name", ["neox-parallel", "neox-sequential-half", "qwen2-gqa", "gemma-mqa-wide-heads",
                                  "mistral-window-5"])
def test_hf_directory_round_trip(name, tmp_path):
    hf, ours = _pair(name)
    out = save_hf_dir(ours, tmp_path / "model")
    model_type = json.loads((out / "config.json").read_text())["model_type"]
    assert model_type == hf.config.model_type
    reloaded_hf = HF_CLASSES[model_type].from_pretrained(out, attn_implementation="eager").eval()
    back = load_hf_dir(out)
    idx = torch.randint(0, V, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(reloaded_hf(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
        assert torch.equal(back(idx)[0], ours(idx)[0])
