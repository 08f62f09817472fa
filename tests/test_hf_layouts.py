"""Hugging Face directories as they lie on a user's disk, built here from random weights: sharded
safetensors with their index, fp16/bf16 stored weights, GPT-2's original hub file (no `transformer.`
prefix), Pythia's `gpt_neox.`/`embed_out` names with its old config keys, and a tokenizer.json beside
the weights. Each loads through lumen.formats.load and agrees with transformers."""

import json

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lumen.errors import MissingFileError
from lumen.formats import load

V = 97
IDX = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(1))


def _random(model):
    model.eval().config._attn_implementation = "eager"
    with torch.no_grad():  # HF inits biases and norms to 0/1: randomise them so they are tested too
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _qwen2():
    torch.manual_seed(0)
    return _random(Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48)))


def _logits(model, idx=IDX):
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, "logits") else out[0]


def test_sharded_safetensors_with_index(tmp_path):
    hf = _qwen2()
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (tmp_path / "model.safetensors").exists()
    loaded = load(str(tmp_path)).model
    torch.testing.assert_close(_logits(loaded), _logits(hf), atol=1e-5, rtol=0)
    (tmp_path / shards[1]).unlink()
    with pytest.raises(MissingFileError, match=f"lacks {shards[1]}"):
        load(tmp_path)


@pytest.mark.parametrize("stored", [torch.float16, torch.bfloat16])
def test_half_precision_weights_load_into_the_requested_dtype(tmp_path, stored):
    hf = _qwen2()
    hf.to(stored).save_pretrained(tmp_path)
    hf = hf.float()  # the stored (rounded) weights, computed in float32 by transformers
    ours = load(tmp_path).model
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    torch.testing.assert_close(_logits(ours), _logits(hf), atol=1e-5, rtol=0)
    bf16 = load(tmp_path, dtype=torch.bfloat16).model
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert torch.equal(bf16.blocks[0].attn.k.weight, hf.model.layers[0].self_attn.k_proj.weight.bfloat16())


def test_gpt2_original_hub_file_without_transformer_prefix(tmp_path):
    torch.manual_seed(0)
    hf = _random(GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=32, n_embd=48, n_layer=2, n_head=4)))
    # as openai-community/gpt2's model.safetensors: `h.0.attn.c_attn.weight`, `wte.weight`, the causal mask
    # buffers `h.i.attn.bias`, and no lm_head (tied to wte)
    state = {k.removeprefix("transformer."): v.contiguous() for k, v in hf.state_dict().items()}
    del state["lm_head.weight"]
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, 32, 32).tril()
    assert "h.0.attn.c_attn.weight" in state and "wte.weight" in state
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    torch.testing.assert_close(_logits(load(str(tmp_path)).model), _logits(hf), atol=1e-5, rtol=0)


def test_pythia_names_and_config_keys(tmp_path):
    torch.manual_seed(0)
    hf = _random(GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=V, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=48, rotary_pct=0.25, hidden_act="gelu")))
    # as EleutherAI/pythia-*'s files: the unembedding is `embed_out`, old buffers ride along, and config.json
    # has the old rotary keys
    state = {("embed_out.weight" if k == "lm_head.weight" else k): v.contiguous() for k, v in hf.state_dict().items()}
    for i in range(2):
        state[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(4)
        state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
    assert {"embed_out.weight", "gpt_neox.embed_in.weight", "gpt_neox.layers.0.mlp.dense_h_to_4h.weight"} <= set(state)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": V,
              "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "max_position_embeddings": 48, "rotary_pct": 0.25, "rotary_emb_base": 10000, "hidden_act": "gelu",
              "layer_norm_eps": 1e-5, "use_parallel_residual": True, "tie_word_embeddings": False,
              "rope_scaling": None, "torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load(str(tmp_path)).model
    assert loaded.cfg.rotary_dims == 4 and loaded.cfg.norm_placement == "parallel"
    torch.testing.assert_close(_logits(loaded), _logits(hf), atol=1e-5, rtol=0)


def test_tokenizer_json_in_the_directory_is_the_tokenizer(tmp_path):
    _qwen2().save_pretrained(tmp_path)
    words = ["[UNK]", "the", "cat", "sat", "on", "mat", "."]
    tok = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load(str(tmp_path))
    text = "the cat sat on the mat ."
    assert loaded.tokenizer.encode(text) == tok.encode(text).ids == [1, 2, 3, 4, 1, 5, 6]
