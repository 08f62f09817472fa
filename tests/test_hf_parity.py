"""Hugging Face transformers as the numerical reference: random-weight GPT-2 and Llama models of
several shapes, converted to lumen, must give the same residual stream, logits and greedy tokens."""

import copy
import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from helpers.families import HF_CLASSES as FAMILY_CLASSES
from helpers.families import SHAPES as FAMILY_SHAPES
from lumen import GPT
from lumen.errors import ModelFileError, UserError
from lumen.formats import load
from lumen.formats.hf import config_from_hf, from_hf_model, save_hf_dir

V = 97
SHAPES = {
    "gpt2-tied": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=48, n_embd=64, n_layer=3, n_head=4)),
    "gpt2-untied-relu": lambda: GPT2LMHeadModel(GPT2Config(
        vocab_size=V, n_positions=48, n_embd=48, n_layer=2, n_head=3, n_inner=80, activation_function="relu",
        tie_word_embeddings=False)),
    "llama-gqa-untied": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, rope_theta=5000.0)),
    "llama-mha-tied-bias": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=6, max_position_embeddings=48, tie_word_embeddings=True, attention_bias=True,
        rms_norm_eps=1e-5)),
    "llama-mqa": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=48, rope_theta=100000.0)),
}
SHAPES |= FAMILY_SHAPES  # GPT-NeoX/Pythia, Qwen2, Gemma, Mistral: the same tests for every family
HF_CLASSES = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM, **FAMILY_CLASSES}


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
    for i, s in enumerate(streams[:-1]):  # (float32 rounding grows with the stream: ~1e-6 of it, MKL's AVX2 and
        # AVX-512 products adding in orders of their own)
        torch.testing.assert_close(s, hidden[i + 1], atol=1e-5, rtol=1e-6, msg=f"stream after block {i}")
    torch.testing.assert_close(ours.ln_f(streams[-1]), hidden[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", SHAPES)
def test_greedy_decode_agrees_with_hf_generate(name):
    hf, ours = _pair(name)
    prompt = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(2))
    ref = hf.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None,
                      attention_mask=torch.ones_like(prompt))
    cached = ours.generate(prompt, 16, temperature=0)
    assert torch.equal(cached, ref)
    assert torch.equal(ours.generate(prompt, 16, temperature=0, use_cache=False), cached)


@pytest.mark.parametrize("name", ["gpt2-untied-relu", "llama-gqa-untied", "llama-mha-tied-bias", "neox-parallel",
                                  "neox-sequential-half", "qwen2-gqa", "gemma-mqa-wide-heads", "mistral-window-5",
                                  # families-a (Phi-3 is written back as Mistral: its unfused layout)
                                  "llama3-scaled-gqa", "qwen3-gqa", "olmo2-gqa", "phi3-window",
                                  "phi2-partial-qk-layernorm", "gptj-rotary-16"])
def test_hf_directory_round_trip(name, tmp_path):
    hf, ours = _pair(name)
    out = save_hf_dir(ours, tmp_path / "model")
    model_type = json.loads((out / "config.json").read_text())["model_type"]
    assert model_type == {"phi3": "mistral"}.get(hf.config.model_type, hf.config.model_type)
    reloaded_hf = HF_CLASSES[model_type].from_pretrained(out, attn_implementation="eager").eval()
    back = load(out).model
    idx = torch.randint(0, V, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(reloaded_hf(idx).logits, hf(idx).logits, atol=1e-5, rtol=0)
        assert torch.equal(back(idx)[0], ours(idx)[0])


def test_unsupported_hf_configs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="model_type 'bert' is not supported"):
        config_from_hf({"model_type": "bert"})
    llama = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                        rope_scaling={"rope_type": "yarn", "factor": 2.0}).to_dict()
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):  # (linear and llama3 are read)
        config_from_hf(llama)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load(tmp_path)
    hf, ours = _pair("llama-mqa")
    save_hf_dir(ours, tmp_path / "a")
    with pytest.raises(UserError, match="not an empty directory"):
        save_hf_dir(ours, tmp_path / "a")
    with pytest.raises(ValueError, match="no Hugging Face architecture"):
        save_hf_dir(GPT(ours.cfg.replace(norm="layernorm")), tmp_path / "b")


def test_gpt2_without_scaled_attention_is_refused_naming_the_key(tmp_path):
    """scale_attn_weights=false (scores not divided by sqrt(d_head)) changes transformers' logits; lumen once loaded
    such a file as if it were true and gave wrong logits without a word. Now it is one clear line."""
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=48, n_embd=64, n_layer=2, n_head=4,
                                    scale_attn_weights=False)).eval()
    hf.save_pretrained(tmp_path / "m")
    scaled = GPT2LMHeadModel.from_pretrained(tmp_path / "m", scale_attn_weights=True).eval()
    idx = torch.randint(0, V, (1, 20))
    with torch.no_grad():
        assert not torch.allclose(hf(idx).logits, scaled(idx).logits, atol=1e-3)  # the key matters
    with pytest.raises(ModelFileError, match="scale_attn_weights=false") as e:
        load(tmp_path / "m")
    assert "config.json" in str(e.value) and "\n" not in str(e.value)


# --- families-a: the thresholds, shape by shape ---------------------------------------------------------
A_SHAPES = ["llama3-scaled-gqa", "llama-linear-scaled", "qwen3-gqa", "olmo2-gqa", "phi3-window",
            "phi2-partial-qk-layernorm", "gptj-rotary-16"]


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("name", [A_SHAPES[0]] + [pytest.param(n, marks=pytest.mark.slow)
                                                  for n in A_SHAPES[1:] + [n for n in SHAPES if n not in A_SHAPES]])
def test_float64_bfloat16_padding_and_32_greedy_steps_agree(name):
    """float32 within 5e-5 relative; float64 within 1e-6 (transformers' RMSNorms compute in float32 even in a
    float64 model: what is left is their rounding, two orders below the float32 bound); bfloat16 as close to the
    float64 logits as transformers' own bfloat16 (within 2x, or 1e-2);
    32 greedy tokens equal to transformers' generate; a padded batch gives each prompt what it gets alone."""
    from lumen.tokenizers import pad

    hf, ours = _pair(name)
    idx = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert _rel(ours(idx)[0], hf(idx).logits) < 5e-5
        hf64 = copy.deepcopy(hf).double()
        hf64.config._experts_implementation = "eager"  # (transformers' grouped expert products have no float64)
        truth = hf64(idx).logits
        assert _rel(GPT.from_state(ours.cfg, ours.state_dict(), dtype=torch.float64)(idx)[0], truth) < 1e-6
        ours16 = GPT.from_state(ours.cfg, ours.state_dict(), dtype=torch.bfloat16)(idx)[0].double()
        ref16 = copy.deepcopy(hf).to(torch.bfloat16)(idx).logits.double()
        # bfloat16 against the float64 logits, over all of them: lumen's error no more than twice transformers'
        # own, or within 1e-2 (a few bf16 steps; measured up to 1.8e-2 apart from each other on Gemma 2 and 3)
        error = {who: ((x - truth).norm() / truth.norm()).item() for who, x in (("ours", ours16), ("hf", ref16))}
        assert error["ours"] < max(2 * error["hf"], 1e-2), error
        prompts = [idx[0, :7].tolist(), idx[1, :13].tolist()]
        for side in ("left", "right"):
            batch = pad(prompts, side)
            logits = ours(batch.ids, mask=batch.mask)[0]
            for b, p in enumerate(prompts):
                alone = hf(torch.tensor([p])).logits[0]
                assert _rel(logits[b][batch.mask[b]], alone) < 5e-5
    prompt = idx[:, :5]
    ref = hf.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None,
                      attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours.generate(prompt, 32, temperature=0), ref)


def test_llama3_rope_scaling_in_the_older_spelling_is_read_too(tmp_path):
    """Llama 3.1's config.json as the hub has it: rope_theta at the top and rope_scaling {"rope_type": "llama3"}
    (transformers 5 writes rope_parameters instead). Both transformers and lumen read it; the logits agree."""
    hf, ours = _pair("llama3-scaled-gqa")
    hf.save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    c = json.loads(path.read_text())
    rope = c.pop("rope_parameters")
    c |= {"rope_theta": rope.pop("rope_theta"), "rope_scaling": rope}
    path.write_text(json.dumps(c))
    ref = LlamaForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    assert ref.config.rope_parameters["rope_type"] == "llama3"
    idx = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(idx).logits
        torch.testing.assert_close(load(tmp_path / "m").model(idx)[0], want, atol=1e-5, rtol=0)
        assert not torch.allclose(GPT.from_state(ours.cfg.replace(rope_scaling=None), ours.state_dict())(idx)[0],
                                  want, atol=1e-3)   # the scaling matters at these positions
