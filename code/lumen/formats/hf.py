"""Hugging Face interop: the state dicts and config.json of GPT-2, Llama, Qwen2, Mistral, Gemma and
GPT-NeoX (Pythia), both ways.

The key maps are plain tables. Two layouts need more than a rename: GPT-2's Conv1D stores weights as
(in, out) and fuses W_Q, W_K, W_V into one c_attn matrix; GPT-NeoX fuses them into query_key_value with
the rows of each head together ([q_h, k_h, v_h] for head h).

A directory this module writes is one transformers' from_pretrained reads; `hub_snapshot` finds (or
downloads) a hub model in the Hugging Face cache:

    >>> weights = read_hf_dir("path/to/hf-dir")                       # doctest: +SKIP
    >>> save_hf_dir(lumen.formats.load("smollm2").model, "out/")      # doctest: +SKIP
    >>> pythia = read_hf_dir(hub_snapshot("EleutherAI/pythia-70m"))   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config import ModelConfig, RopeScaling, pattern
from ..decode import Sampling
from ..errors import ConfigError, FetchError, MissingFileError, ModelFileError, UserError
from ..files import atomic_dir, read_json
from ..model import GPT
from ..tokenizers import Tokenizer
from .weights import Weights, check_one_unembedding, read_safetensors

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# lumen's activation names (config.ACTIVATIONS) in Hugging Face's spelling, and back (with HF's aliases)
HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
FROM_HF_ACTIVATIONS = {v: k for k, v in HF_ACTIVATIONS.items()} | {"gelu_pytorch_tanh": "gelu_tanh", "swish": "silu"}
FAMILIES: tuple[str, ...] = ("gpt2", "llama", "qwen2", "mistral", "gemma", "gpt_neox")
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "mistral": "MistralForCausalLM", "gemma": "GemmaForCausalLM", "gpt_neox": "GPTNeoXForCausalLM"}
# families-a: Qwen3, OLMo-2, Phi-3 (read only: written back as Llama or Mistral), Phi (Phi-2), GPT-J
FAMILIES += ("qwen3", "olmo2", "phi3", "phi", "gptj")
ARCHITECTURES |= {"qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM", "phi": "PhiForCausalLM",
                  "gptj": "GPTJForCausalLM"}
# families-b: per-layer windows and RoPE, sandwich norms, soft-capping, mixtures of experts
FAMILIES_B = ("gemma2", "gemma3_text", "smollm3", "qwen3_moe", "olmoe")
FAMILIES += FAMILIES_B
ARCHITECTURES |= {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}
# lumen's kinds of attention layer (ModelConfig.layer_types) in HF's spelling
HF_LAYER_TYPES = {"full": "full_attention", "sliding": "sliding_attention"}


# ---------------------------------------------------------------------------------------------
# config.json
def family(cfg: ModelConfig) -> str:
    """Which Hugging Face architecture can hold this config (one of FAMILIES)."""
    b = _family_b(cfg)
    if b is not None:
        return b
    fam = _family_a(cfg)
    if fam is not None:
        return fam
    if cfg.qk_norm or cfg.rope_interleaved or cfg.head_bias or cfg.attn_bias is not None:
        raise ModelFileError(f"config {cfg.name!r} matches no Hugging Face architecture: q/k norms are Qwen3's, "
                             "OLMo-2's or Phi's; interleaved RoPE GPT-J's; an unembedding bias Phi's or GPT-J's")
    if cfg.rope_scaling is not None and cfg.positions != "rope":
        raise ModelFileError(f"config {cfg.name!r}: rope_scaling needs positions 'rope'")
    parts = (cfg.mlp, cfg.norm, cfg.positions, cfg.norm_placement)
    # GPT-2 and GPT-NeoX: plain multi-head attention over heads that fill d_model, biases everywhere
    mha = cfg.bias and cfg.kv_heads == cfg.n_heads and cfg.n_heads * cfg.head_dim == cfg.d_model
    mha = mha and not cfg.scale_embeddings and cfg.sliding_window is None
    if parts == ("mlp", "layernorm", "learned", "pre") and mha:
        return "gpt2"
    if (cfg.mlp, cfg.norm, cfg.positions) == ("mlp", "layernorm", "rope") and cfg.norm_placement != "post" and mha:
        return "gpt_neox"
    if parts == ("geglu", "rmsnorm_offset", "rope", "pre") and cfg.scale_embeddings and cfg.rotary_fraction == 1.0:
        if not cfg.bias and not cfg.qkv_bias and cfg.sliding_window is None and cfg.activation == "gelu_tanh":
            return "gemma"
    if parts == ("swiglu", "rmsnorm", "rope", "pre") and cfg.rotary_fraction == 1.0 and not cfg.scale_embeddings:
        if cfg.sliding_window is not None and not (cfg.bias or cfg.qkv_bias):
            return "mistral"
        if cfg.sliding_window is None:
            return "qwen2" if cfg.qkv_bias and not cfg.bias else "llama"
    raise ModelFileError(
        f"config {cfg.name!r} matches no Hugging Face architecture: GPT-2 needs layernorm + mlp + learned positions + "
        "biases + pre-LN; Llama needs rmsnorm + swiglu + rope + pre-LN (Qwen2: + qkv_bias, Mistral: + sliding_window); "
        "Gemma needs rmsnorm_offset + geglu + scale_embeddings; GPT-NeoX needs layernorm + mlp + rope + biases"
    )


def _family_b(cfg: ModelConfig) -> str | None:
    """families-b's architectures (FAMILIES_B), or None for the others; a config with one of their details
    that fits none of them is refused here."""
    details = (cfg.norm_placement == "sandwich", cfg.layer_types is not None, cfg.rope_local_theta is not None,
               not all(cfg.rope_layers), cfg.query_pre_attn_scalar is not None, cfg.attn_softcap is not None,
               cfg.final_softcap is not None, cfg.n_experts is not None)
    if not any(details):
        return None
    plain = cfg.positions == "rope" and cfg.rotary_fraction == 1.0 and not (cfg.qkv_bias or cfg.bias)
    plain = plain and not (cfg.rope_interleaved or cfg.head_bias) and cfg.attn_bias is None and cfg.rope_scaling is None
    gemma = (cfg.mlp, cfg.norm, cfg.norm_placement) == ("geglu", "rmsnorm_offset", "sandwich") and cfg.scale_embeddings
    if plain and gemma and all(cfg.rope_layers) and cfg.n_experts is None:
        if cfg.qk_norm is None and cfg.rope_local_theta is None:
            return "gemma2"
        if cfg.qk_norm == "head" and cfg.attn_softcap is None and cfg.final_softcap is None:
            return "gemma3_text"
    llama = (cfg.mlp, cfg.norm, cfg.norm_placement) == ("swiglu", "rmsnorm", "pre") and not cfg.scale_embeddings
    rest = (cfg.layer_types, cfg.rope_local_theta, cfg.query_pre_attn_scalar, cfg.attn_softcap, cfg.final_softcap,
            cfg.sliding_window)
    if plain and llama and all(v is None for v in rest):
        if cfg.n_experts is None and cfg.qk_norm is None:
            return "smollm3"
        if cfg.n_experts is not None and cfg.qk_norm == "head" and all(cfg.rope_layers):
            return "qwen3_moe"
        if cfg.n_experts is not None and cfg.qk_norm == "projection" and all(cfg.rope_layers) and cfg.d_head is None:
            return "olmoe"
    raise ModelFileError(
        f"config {cfg.name!r} matches no Hugging Face architecture: Gemma 2 needs rmsnorm_offset + geglu + sandwich "
        "norms + scale_embeddings (Gemma 3: + per-head q/k norms, no soft-caps); SmolLM3 is Llama with rope_layers; "
        "Qwen3-MoE is Qwen3 (per-head q/k norms) with n_experts; OLMoE is Llama with q/k norms over the whole "
        "projection (and d_head = d_model / n_heads) and n_experts"
    )


def _config_to_hf_b(cfg: ModelConfig, fam: str, out: dict) -> dict:
    """config.json's keys for families-b's architectures, added to the Llama-style ones in `out`."""
    if fam in ("gemma2", "gemma3_text"):
        out.pop("hidden_act")
        types = [HF_LAYER_TYPES[t] for t in cfg.per_layer(cfg.layer_types or (cfg.layer_type(0),))]
        out |= {"hidden_activation": HF_ACTIVATIONS_GATED[cfg.activation], "attention_bias": False,
                "query_pre_attn_scalar": _number(cfg.query_pre_attn_scalar or cfg.head_dim),
                "sliding_window": cfg.sliding_window, "layer_types": types,
                "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.final_softcap}
    if fam == "gemma3_text":  # a RoPE base for each kind of layer
        out.pop("rope_theta")
        out["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_base_of("sliding")},
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta}}
        out |= {"use_bidirectional_attention": False, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None}
    if fam == "qwen3_moe":
        out |= {"attention_bias": False, "use_sliding_window": False, "sliding_window": None,
                "num_experts": cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token,
                "moe_intermediate_size": cfg.hidden, "norm_topk_prob": cfg.norm_topk_prob,
                "decoder_sparse_step": 1, "mlp_only_layers": []}
    if fam == "olmoe":  # (its expert width is intermediate_size, set above)
        out |= {"attention_bias": False, "clip_qkv": None, "num_experts": cfg.n_experts,
                "num_experts_per_tok": cfg.experts_per_token, "norm_topk_prob": cfg.norm_topk_prob}
    if fam == "smollm3":
        out |= {"attention_bias": False, "mlp_bias": False, "use_sliding_window": False, "sliding_window": None,
                "no_rope_layers": [int(r) for r in cfg.per_layer(cfg.rope_layers)],  # (HF: 1 = has RoPE)
                "layer_types": ["full_attention"] * cfg.n_layers,
                "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # (HF's defaults: Llama 3's ids)
    return out


def _number(x: float) -> int | float:
    """A whole number as an int (HF's strict config fields refuse 256.0 where they expect 256)."""
    return int(x) if float(x).is_integer() else x


# a gated MLP's GELU in HF's spelling (Gemma 2's hidden_activation): the tanh one as HF's Gemma configs name it
HF_ACTIVATIONS_GATED = HF_ACTIVATIONS | {"gelu_tanh": "gelu_pytorch_tanh"}


def _config_from_hf_b(c: dict, kind: str, name: str) -> ModelConfig:
    """The ModelConfig of a config.json of one of FAMILIES_B."""
    local_theta = None
    if kind == "gemma3_text":  # rope_parameters by kind of layer: {"sliding_attention": {...}, "full_attention": ...}
        c, local_theta = _gemma3_rope(c)
    theta, fraction = _rope(c)
    if fraction != 1.0:
        raise ModelFileError(f"{kind} configs with partial rotary ({fraction}) are not supported")
    for key in ("attention_bias", "mlp_bias", "use_sliding_window", "use_bidirectional_attention"):
        if c.get(key):
            raise ModelFileError(f"{kind} configs with {key}=true are not supported")
    d, h = c["hidden_size"], c["num_attention_heads"]
    shape = dict(name=name, vocab_size=c["vocab_size"], context=c.get("max_position_embeddings", 2048), d_model=d,
                 n_layers=c["num_hidden_layers"], n_heads=h, n_kv_heads=c.get("num_key_value_heads") or h,
                 d_head=None if c.get("head_dim") in (None, d / h) else c["head_dim"], d_ff=c["intermediate_size"],
                 norm_eps=c.get("rms_norm_eps", 1e-6),
                 positions="rope", rope_theta=theta, bias=False, mlp="swiglu", activation="silu", norm="rmsnorm")
    n = c["num_hidden_layers"]
    if kind in ("gemma2", "gemma3_text"):
        gemma3 = kind == "gemma3_text"
        types = _layer_types(c, n, 6 if gemma3 else 2)
        window = c.get("sliding_window")
        act = _activation(c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh", kind)
        if act not in ("gelu_tanh", "gelu"):
            raise ModelFileError(f"{kind} hidden_activation {act!r} is not supported (only a GELU)")
        return ModelConfig(**shape | dict(
            mlp="geglu", activation=act, norm="rmsnorm_offset", norm_placement="sandwich", scale_embeddings=True,
            tie_embeddings=c.get("tie_word_embeddings", True),
            layer_types=types if window is not None else None, sliding_window=window,
            query_pre_attn_scalar=c.get("query_pre_attn_scalar", 256),
            attn_softcap=c.get("attn_logit_softcapping"), final_softcap=c.get("final_logit_softcapping"),
            qk_norm="head" if gemma3 else None, rope_local_theta=local_theta if local_theta != theta else None))
    if kind in ("qwen3_moe", "olmoe"):
        what = {"qwen3_moe": "Qwen3-MoE", "olmoe": "OLMoE"}[kind]
        if c.get("hidden_act", "silu") != "silu":
            raise ModelFileError(f"{what} hidden_act {c['hidden_act']!r} is not supported (only silu)")
        if c.get("clip_qkv") is not None:  # OLMoE: queries, keys and values clamped to [-clip_qkv, clip_qkv]
            raise ModelFileError(f"OLMoE configs with clip_qkv={c['clip_qkv']!r} (q, k, v clamped) are not supported")
        if kind == "olmoe":  # its experts' width is intermediate_size; its q/k norms span the whole projection
            c = c | {"moe_intermediate_size": c["intermediate_size"]}
            if shape["d_head"] is not None:
                raise ModelFileError(f"OLMoE configs with head_dim={c['head_dim']!r} other than hidden_size / "
                                     "num_attention_heads are not supported")
        if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
            key = "mlp_only_layers" if c.get("mlp_only_layers") else "decoder_sparse_step"
            raise ModelFileError(f"Qwen3-MoE configs with dense layers among the experts' ({key}={c[key]!r}) are not "
                                 "supported: every layer must be a mixture of experts")
        if "num_local_experts" in c:  # (transformers 5's own name for num_experts, which older files use)
            c = c | {"num_experts": c["num_local_experts"]}
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            if not isinstance(c.get(key), int) or isinstance(c.get(key), bool) or c[key] < 1:
                raise ModelFileError(f"{key!r} must be a positive whole number, got {c.get(key)!r}")
        norm_topk = c.get("norm_topk_prob", False)
        if not isinstance(norm_topk, bool):
            raise ModelFileError(f"'norm_topk_prob' must be true or false, got {norm_topk!r}")
        return ModelConfig(**shape | dict(
            d_ff=c["moe_intermediate_size"], tie_embeddings=c.get("tie_word_embeddings", False),
            qk_norm="head" if kind == "qwen3_moe" else "projection",
            n_experts=c["num_experts"], experts_per_token=c["num_experts_per_tok"], norm_topk_prob=norm_topk))
    if kind == "smollm3":
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise ModelFileError(f"SmolLM3 hidden_act {act!r} is not supported (only silu)")
        flags = c.get("no_rope_layers")
        if flags is None:  # HF's default: every no_rope_layer_interval-th block without RoPE
            every = c.get("no_rope_layer_interval", 4)
            flags = [int((i + 1) % every != 0) for i in range(n)]
        if not isinstance(flags, list) or len(flags) != n or not set(flags) <= {0, 1}:
            raise ModelFileError(f"'no_rope_layers' must list 1 (RoPE) or 0 (none) for each of the {n} layers, "
                                 f"got {flags!r}")
        return ModelConfig(**shape | dict(tie_embeddings=c.get("tie_word_embeddings", True),
                                          rope_layers=pattern([bool(f) for f in flags])))
    raise AssertionError(kind)


def _gemma3_rope(c: dict) -> tuple[dict, float]:
    """Gemma 3's config.json with rope_parameters of its full-attention layers only (what _rope reads), and the
    RoPE base of its sliding layers. Either spelling: transformers 5's rope_parameters by layer kind, or the older
    rope_theta and rope_local_base_freq."""
    rope = c.get("rope_parameters") or {}
    if "full_attention" in rope or "sliding_attention" in rope:
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        for key, params in (("full_attention", full), ("sliding_attention", local)):
            if not isinstance(params, dict):
                raise ModelFileError(f"rope_parameters.{key} must be an object, got {params!r}")
            if params.get("rope_type", "default") != "default":
                raise ModelFileError(f"rope_parameters.{key}.rope_type {params['rope_type']!r} (RoPE scaling) is not "
                                     "supported for Gemma 3 (only plain RoPE)")
        theta = local.get("rope_theta", c.get("rope_local_base_freq", 10000.0))
        c = c | {"rope_parameters": full}
    else:
        theta = c.get("rope_local_base_freq", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
        raise ModelFileError(f"the sliding layers' rope_theta must be a positive number, got {theta!r}")
    return c, float(theta)


def _layer_types(c: dict, n: int, period: int = 2) -> tuple[str, ...]:
    """config.json's layer_types in lumen's spelling (HF's default: every period-th layer full, the others sliding)."""
    types = c.get("layer_types") or ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
                                     for i in range(n)]
    back = {v: k for k, v in HF_LAYER_TYPES.items()}
    if not isinstance(types, list) or len(types) != n or not all(t in back for t in types):
        raise ModelFileError(f"'layer_types' must give {' or '.join(back)} for each of the {n} layers, got {types!r}")
    return pattern([back[t] for t in types])


def _family_a(cfg: ModelConfig) -> str | None:
    """Qwen3, OLMo-2, Phi or GPT-J, if cfg is one of them (families-a)."""
    parts = (cfg.mlp, cfg.norm, cfg.positions, cfg.norm_placement)
    plain = not (cfg.scale_embeddings or cfg.rope_interleaved or cfg.head_bias) and cfg.attn_bias is None
    if parts == ("swiglu", "rmsnorm", "rope", "pre") and cfg.qk_norm == "head" and plain:
        if not (cfg.bias or cfg.qkv_bias) and cfg.sliding_window is None and cfg.rotary_fraction == 1.0:
            return "qwen3"
    if parts == ("swiglu", "rmsnorm", "rope", "branch_output") and cfg.qk_norm == "projection" and plain:
        if not (cfg.bias or cfg.qkv_bias) and cfg.sliding_window is None and cfg.rotary_fraction == 1.0:
            return "olmo2"
    if parts == ("mlp", "layernorm", "rope", "parallel_shared") and cfg.head_bias and not cfg.scale_embeddings:
        whole = cfg.sliding_window is None and cfg.n_heads * cfg.head_dim == cfg.d_model and not cfg.tie_embeddings
        if cfg.rope_interleaved and whole and cfg.bias and cfg.attn_bias is False and cfg.qk_norm is None:
            if cfg.kv_heads == cfg.n_heads and cfg.rope_theta == 10000.0 and cfg.rope_scaling is None:
                return "gptj"  # (its RoPE base is fixed)
        if not cfg.rope_interleaved and whole and cfg.bias and cfg.attn_bias is None and cfg.qk_norm in (None, "head"):
            return "phi"
    return None


def _config_to_hf_a(cfg: ModelConfig, fam: str, common: dict, shape: dict, rope: dict) -> dict:
    """config.json of the families-a architectures."""
    if fam == "gptj":
        return common | {
            "n_positions": cfg.context, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
            "rotary_dim": cfg.rotary_dims, "n_inner": cfg.d_ff, "activation_function": HF_ACTIVATIONS[cfg.activation],
            "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout,
        }
    if fam == "phi":
        return common | shape | {
            "num_key_value_heads": cfg.kv_heads, "hidden_act": HF_ACTIVATIONS[cfg.activation],
            "layer_norm_eps": cfg.norm_eps, "rope_parameters": rope | {"partial_rotary_factor": cfg.rotary_fraction},
            "qk_layernorm": cfg.qk_norm == "head", "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
        }
    out = common | shape | {"num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.norm_eps,
                            "rope_parameters": rope, "hidden_act": "silu", "attention_bias": False}
    return out | ({"use_sliding_window": False, "sliding_window": None} if fam == "qwen3" else {})


def _rope_parameters(cfg: ModelConfig) -> dict:
    """rope_parameters as transformers 5 spells them, with the frequency rescaling if any."""
    rope: dict = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    sc = cfg.rope_scaling
    if sc is not None:
        rope |= {"rope_type": sc.kind, "factor": sc.factor}
        if sc.kind == "llama3":
            rope |= {"low_freq_factor": sc.low_freq_factor, "high_freq_factor": sc.high_freq_factor,
                     "original_max_position_embeddings": sc.original_context}
    return rope


def config_to_hf(cfg: ModelConfig) -> dict:
    fam = family(cfg)
    common = {"architectures": [ARCHITECTURES[fam]], "model_type": fam, "vocab_size": cfg.vocab_size,
              "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": 0.02}
    if fam == "gpt2":
        return common | {
            "n_positions": cfg.context, "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
            "n_inner": cfg.d_ff, "activation_function": HF_ACTIVATIONS[cfg.activation],
            "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout,
        }
    rope = _rope_parameters(cfg)
    shape = {
        "hidden_size": cfg.d_model, "intermediate_size": cfg.hidden, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "max_position_embeddings": cfg.context, "rope_theta": cfg.rope_theta,
        "attention_dropout": cfg.dropout,
    }
    if fam in ("qwen3", "olmo2", "phi", "gptj"):
        return _config_to_hf_a(cfg, fam, common, shape, rope)
    if fam == "gpt_neox":  # the old keys (rotary_pct, rotary_emb_base) too, as Pythia's own config.json has them
        return common | shape | {
            "hidden_act": HF_ACTIVATIONS[cfg.activation], "layer_norm_eps": cfg.norm_eps,
            "use_parallel_residual": cfg.norm_placement == "parallel", "rotary_pct": cfg.rotary_fraction,
            "rotary_emb_base": cfg.rope_theta, "rope_parameters": rope | {"partial_rotary_factor": cfg.rotary_fraction},
            "attention_bias": True, "hidden_dropout": cfg.dropout,
        }
    out = common | shape | {
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope, "hidden_act": "gelu_pytorch_tanh" if fam == "gemma" else "silu",
    }
    if fam == "llama":
        out |= {"attention_bias": cfg.bias, "mlp_bias": False}
    if fam == "mistral":
        out["sliding_window"] = cfg.sliding_window
    if fam == "qwen2":
        out |= {"use_sliding_window": False, "sliding_window": None}
    if fam in FAMILIES_B:
        out = _config_to_hf_b(cfg, fam, out)
    return out


def _rope(c: dict, default_theta: float = 10000.0) -> tuple[float, float]:
    """(theta, rotary fraction) from either config.json spelling; RoPE variants are refused (see _rope_scaling)."""
    rope = c.get("rope_parameters") or {}
    scaling = c.get("rope_scaling") or {}
    for key, params in (("rope_parameters", rope), ("rope_scaling", scaling)):
        if _rope_type(params) != "default":
            raise ModelFileError(f"{key}.rope_type {_rope_type(params)!r} (RoPE scaling) is not supported by this "
                                 "family (only plain RoPE)")
    theta = rope.get("rope_theta", c.get("rope_theta", c.get("rotary_emb_base", default_theta)))
    fraction = rope.get("partial_rotary_factor", c.get("rotary_pct", c.get("partial_rotary_factor", 1.0)))
    return float(theta), float(fraction)


def _rope_type(params: dict) -> object:
    """A rope_parameters/rope_scaling object's type, in either spelling ("type" is the older)."""
    return params.get("rope_type", params.get("type", "default"))


def _rope_scaling(c: dict) -> tuple[dict, RopeScaling | None]:
    """config.json without its RoPE rescaling (for _rope), and the rescaling as a RopeScaling: "linear" and
    "llama3" in either spelling (transformers 5's rope_parameters, the older rope_scaling); "dynamic", "yarn",
    "longrope" and others are refused naming the key."""
    rope, scaling = c.get("rope_parameters") or {}, c.get("rope_scaling") or {}
    scaled = [(k, p) for k, p in (("rope_parameters", rope), ("rope_scaling", scaling)) if _rope_type(p) != "default"]
    if not scaled:
        return c, None
    key, params = scaled[0]   # (transformers 5's spelling first)
    kind = _rope_type(params)
    if kind not in ("linear", "llama3"):
        raise ModelFileError(f"{key}.rope_type {kind!r} is not supported; lumen reads RoPE scaling 'linear' and "
                             "'llama3' (or none: 'default')")
    named: dict[str, Any] = {} if kind == "linear" else dict(
        low_freq_factor=params.get("low_freq_factor"), high_freq_factor=params.get("high_freq_factor"),
        original_context=params.get("original_max_position_embeddings", c.get("max_position_embeddings")))
    try:
        found = RopeScaling(kind, params.get("factor"), **named)  # type: ignore[arg-type]  # (checked there)
    except ConfigError as e:
        raise ModelFileError(f"{key}: {e}") from None
    def plain(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in ("rope_type", "type")}

    return c | {"rope_parameters": plain(rope), "rope_scaling": plain(scaling)}, found


def _activation(act: str, kind: str) -> str:
    if act not in FROM_HF_ACTIVATIONS:
        raise ModelFileError(f"{kind} activation {act!r} is not supported; supported: {', '.join(FROM_HF_ACTIVATIONS)}")
    return FROM_HF_ACTIVATIONS[act]


# the config.json keys config_from_hf reads, by the type their values must have; and the ones it needs
_HF_INTS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "hidden_size", "intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "head_dim",
            "rotary_dim")
_HF_FLOATS = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "rope_theta", "rotary_emb_base", "rotary_pct",
              "partial_rotary_factor")
_HF_OPTIONAL_FLOATS = ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")  # null: none
_HF_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "scale_attn_by_inverse_layer_idx",
             "reorder_and_upcast_attn", "scale_attn_weights", "use_sliding_window", "qk_layernorm")
_HF_REQUIRED = {"gpt2": ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"),
                "llama": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}
_HF_REQUIRED["gptj"] = _HF_REQUIRED["gpt2"]


def check_hf_config(c: object) -> None:
    """The values config_from_hf reads have the types they promise (a damaged config.json fails here with the
    key's name); ModelConfig then checks their ranges. null means "the default" for the optional keys."""
    if not isinstance(c, dict):
        raise ModelFileError(f"the config holds a JSON {type(c).__name__}, not an object")
    kind = c.get("model_type")
    if not isinstance(kind, str):
        raise ModelFileError(f"'model_type' must be a string such as \"llama\", got {kind!r}")
    like_llama = ("mistral", "qwen2", "gemma", "gpt_neox", "qwen3", "olmo2", "phi3", "phi", *FAMILIES_B)
    for key in _HF_REQUIRED.get("llama" if kind in like_llama else kind, ()):
        if c.get(key) is None:
            raise ModelFileError(f"the config lacks {key!r}, which a {kind} model needs")
    for keys, ok, what in ((_HF_INTS, lambda v: isinstance(v, int) and v > 0, "a positive whole number"),
                           (_HF_FLOATS, lambda v: isinstance(v, (int, float)) and math.isfinite(v), "a finite number"),
                           (_HF_BOOLS, lambda v: True, "true or false")):
        for key in keys:
            v = c.get(key)
            if (v is not None or keys is _HF_FLOATS and key in c) and (isinstance(v, bool) != (keys is _HF_BOOLS)
                                                                       or not ok(v)):
                raise ModelFileError(f"{key!r} must be {what}, got {v!r}")
    for key in _HF_OPTIONAL_FLOATS:
        v = c.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
            raise ModelFileError(f"{key!r} must be a positive number or null, got {v!r}")
    for key in ("rope_parameters", "rope_scaling"):
        if not isinstance(c.get(key), (dict, type(None))):
            raise ModelFileError(f"{key!r} must be an object, got {c[key]!r}")
    rope_theta = (c.get("rope_parameters") or {}).get("rope_theta")
    if rope_theta is not None and (isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float))):
        raise ModelFileError(f"rope_parameters.rope_theta must be a number, got {rope_theta!r}")


def config_from_hf(c: dict, name: str = "hf") -> ModelConfig:
    check_hf_config(c)
    kind = c.get("model_type")
    if kind == "gpt2":
        if c.get("scale_attn_by_inverse_layer_idx") or c.get("reorder_and_upcast_attn"):
            raise ModelFileError(
                "GPT-2 configs with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported"
            )
        if c.get("scale_attn_weights", True) is not True:  # scores not divided by sqrt(d_head): not lumen's attention
            raise ModelFileError("GPT-2 configs with scale_attn_weights=false (attention scores not divided by "
                                 "sqrt(d_head)) are not supported; set it to true only if the model was trained so")
        return ModelConfig(
            name=name, vocab_size=c["vocab_size"], context=c["n_positions"], d_model=c["n_embd"],
            n_layers=c["n_layer"], n_heads=c["n_head"], d_ff=c.get("n_inner"), mlp="mlp",
            activation=_activation(c.get("activation_function", "gelu_new"), "GPT-2"), norm="layernorm",
            norm_eps=c.get("layer_norm_epsilon", 1e-5), positions="learned", bias=True,
            tie_embeddings=c.get("tie_word_embeddings", True),
        )
    if kind == "gpt_neox":
        theta, fraction = _rope(c)
        if not c.get("attention_bias", True):
            raise ModelFileError("GPT-NeoX configs with attention_bias=false are not supported")
        return ModelConfig(
            name=name, vocab_size=c["vocab_size"], context=c.get("max_position_embeddings", 2048),
            d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
            d_ff=c.get("intermediate_size"), mlp="mlp", activation=_activation(c.get("hidden_act", "gelu"), "GPT-NeoX"),
            norm="layernorm", norm_eps=c.get("layer_norm_eps", 1e-5),
            norm_placement="parallel" if c.get("use_parallel_residual", True) else "pre", positions="rope",
            rope_theta=theta, rotary_fraction=fraction, bias=True, tie_embeddings=c.get("tie_word_embeddings", False),
        )
    if kind in ("phi", "gptj"):
        return _config_from_hf_parallel(c, kind, name)
    if kind in ("llama", "mistral", "qwen2", "gemma", "qwen3", "olmo2", "phi3"):
        _check_layer_types(c, kind)
        c, scaling = _rope_scaling(c)
        theta, fraction = _rope(c)
        if fraction != 1.0 and kind != "phi3":
            raise ModelFileError(f"{kind} configs with partial rotary ({fraction}) are not supported")
        if c.get("mlp_bias"):
            raise ModelFileError(f"{kind} configs with mlp_bias=true are not supported (lumen's gated MLPs have none)")
        act = c.get("hidden_activation") or c.get("hidden_act", "silu")
        if kind == "gemma":  # Gemma's "gelu" always meant the tanh approximation (transformers converts it too)
            act = "gelu_pytorch_tanh" if act == "gelu" else act
            if act != "gelu_pytorch_tanh":
                raise ModelFileError(f"Gemma hidden_act {act!r} is not supported (only gelu_pytorch_tanh)")
        elif act != "silu":
            raise ModelFileError(f"{kind} hidden_act {act!r} is not supported (only silu)")
        window = c.get("sliding_window") if kind in ("mistral", "phi3") else None
        if kind in ("qwen2", "qwen3") and c.get("use_sliding_window"):
            raise ModelFileError(f"{kind} configs with use_sliding_window=true (windows on some layers): not supported")
        d, h = c["hidden_size"], c["num_attention_heads"]
        gemma = kind == "gemma"
        if kind in ("qwen3", "olmo2", "phi3"):
            return _config_from_hf_a(c, kind, name, theta, fraction, scaling, window)
        return ModelConfig(
            name=name, vocab_size=c["vocab_size"], context=c.get("max_position_embeddings", 2048), d_model=d,
            n_layers=c["num_hidden_layers"], n_heads=h, n_kv_heads=c.get("num_key_value_heads") or h,
            d_head=c.get("head_dim") or None, d_ff=c["intermediate_size"], mlp="geglu" if gemma else "swiglu",
            activation="gelu_tanh" if gemma else "silu", norm="rmsnorm_offset" if gemma else "rmsnorm",
            norm_eps=c.get("rms_norm_eps", 1e-6), positions="rope", rope_theta=theta,
            bias=bool(c.get("attention_bias", False)) and kind != "qwen2", qkv_bias=kind == "qwen2",
            tie_embeddings=c.get("tie_word_embeddings", gemma), scale_embeddings=gemma, sliding_window=window,
            rope_scaling=scaling,
        )
    if kind in FAMILIES_B:
        return _config_from_hf_b(c, kind, name)
    raise ModelFileError(f"Hugging Face model_type {kind!r} is not supported; supported: {', '.join(FAMILIES)}")


def _check_layer_types(c: dict, kind: str) -> None:
    """transformers' per-layer attention kinds: lumen's families-a models attend the same way in every layer."""
    types = c.get("layer_types")
    if types is not None and (not isinstance(types, list) or set(types) - {"full_attention"}):
        raise ModelFileError(f"{kind} configs with layer_types other than full_attention in every layer (windows on "
                             f"some layers) are not supported; got {str(types)[:80]}")


def _config_from_hf_a(c: dict, kind: str, name: str, theta: float, fraction: float, scaling: RopeScaling | None,
                      window: int | None) -> ModelConfig:
    """Qwen3 (q/k norm per head), OLMo-2 (branch-output norms, q/k norm over the projection) and Phi-3 (Llama with
    fused projections in its files): their config.json after the checks config_from_hf shares with Llama."""
    h = c["num_attention_heads"]
    if kind == "olmo2" and c.get("attention_bias"):
        raise ModelFileError("olmo2 configs with attention_bias=true are not supported")
    return ModelConfig(
        name=name, vocab_size=c["vocab_size"], context=c.get("max_position_embeddings", 2048), d_model=c["hidden_size"],
        n_layers=c["num_hidden_layers"], n_heads=h, n_kv_heads=c.get("num_key_value_heads") or h,
        d_head=c.get("head_dim") or None, d_ff=c["intermediate_size"], mlp="swiglu", activation="silu", norm="rmsnorm",
        norm_eps=c.get("rms_norm_eps", 1e-6), positions="rope", rope_theta=theta, rotary_fraction=fraction,
        bias=bool(c.get("attention_bias", False)), tie_embeddings=c.get("tie_word_embeddings", False),
        sliding_window=window, rope_scaling=scaling,
        norm_placement="branch_output" if kind == "olmo2" else "pre",
        qk_norm={"qwen3": "head", "olmo2": "projection"}.get(kind),
    )


def _config_from_hf_parallel(c: dict, kind: str, name: str) -> ModelConfig:
    """Phi (Phi-1/1.5/2) and GPT-J: one LayerNorm read by attention and the MLP side by side, partial RoPE
    (GPT-J's on interleaved pairs), biases on the MLP, and a bias on the unembedding."""
    if kind == "gptj":
        d, h = c["n_embd"], c["n_head"]
        if d % h:
            raise ModelFileError(f"n_embd ({d}) must be divisible by n_head ({h})")
        rotary = c.get("rotary_dim") or d // h
        if rotary > d // h or rotary % 2:
            raise ModelFileError(f"rotary_dim ({rotary}) must be even and at most the head width ({d // h})")
        return ModelConfig(
            name=name, vocab_size=c["vocab_size"], context=c["n_positions"], d_model=d, n_layers=c["n_layer"],
            n_heads=h, d_ff=c.get("n_inner"), mlp="mlp",
            activation=_activation(c.get("activation_function", "gelu_new"), "GPT-J"), norm="layernorm",
            norm_eps=c.get("layer_norm_epsilon", 1e-5), norm_placement="parallel_shared", positions="rope",
            rotary_fraction=rotary / (d // h), rope_interleaved=True, bias=True, attn_bias=False, head_bias=True,
            tie_embeddings=c.get("tie_word_embeddings", False),
        )
    c, scaling = _rope_scaling(c)
    theta, fraction = _rope(c)
    h = c["num_attention_heads"]
    return ModelConfig(
        name=name, vocab_size=c["vocab_size"], context=c.get("max_position_embeddings", 2048), d_model=c["hidden_size"],
        n_layers=c["num_hidden_layers"], n_heads=h, n_kv_heads=c.get("num_key_value_heads") or h,
        d_ff=c.get("intermediate_size"), mlp="mlp", activation=_activation(c.get("hidden_act", "gelu_new"), "Phi"),
        norm="layernorm", norm_eps=c.get("layer_norm_eps", 1e-5), norm_placement="parallel_shared", positions="rope",
        rope_theta=theta, rotary_fraction=fraction, rope_scaling=scaling, bias=True, head_bias=True,
        qk_norm="head" if c.get("qk_layernorm") else None, tie_embeddings=c.get("tie_word_embeddings", False),
    )


# ---------------------------------------------------------------------------------------------
# state dicts
_GPT2_BLOCK = {  # lumen name -> GPT-2 name, inside block i; "*" marks a Conv1D weight (stored transposed)
    "ln1.g": "ln_1.weight", "ln1.b": "ln_1.bias", "ln2.g": "ln_2.weight", "ln2.b": "ln_2.bias",
    "attn.out.weight": "attn.c_proj.weight*", "attn.out.bias": "attn.c_proj.bias",
    "mlp.fc.weight": "mlp.c_fc.weight*", "mlp.fc.bias": "mlp.c_fc.bias",
    "mlp.proj.weight": "mlp.c_proj.weight*", "mlp.proj.bias": "mlp.c_proj.bias",
}
_LLAMA_BLOCK = {  # also Qwen2, Mistral and Gemma
    "ln1.g": "input_layernorm.weight", "ln2.g": "post_attention_layernorm.weight",
    "attn.q.weight": "self_attn.q_proj.weight", "attn.k.weight": "self_attn.k_proj.weight",
    "attn.v.weight": "self_attn.v_proj.weight", "attn.out.weight": "self_attn.o_proj.weight",
    "attn.q.bias": "self_attn.q_proj.bias", "attn.k.bias": "self_attn.k_proj.bias",
    "attn.v.bias": "self_attn.v_proj.bias", "attn.out.bias": "self_attn.o_proj.bias",
    "mlp.w_gate.weight": "mlp.gate_proj.weight", "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
_NEOX_BLOCK = {
    "ln1.g": "input_layernorm.weight", "ln1.b": "input_layernorm.bias",
    "ln2.g": "post_attention_layernorm.weight", "ln2.b": "post_attention_layernorm.bias",
    "attn.out.weight": "attention.dense.weight", "attn.out.bias": "attention.dense.bias",
    "mlp.fc.weight": "mlp.dense_h_to_4h.weight", "mlp.fc.bias": "mlp.dense_h_to_4h.bias",
    "mlp.proj.weight": "mlp.dense_4h_to_h.weight", "mlp.proj.bias": "mlp.dense_4h_to_h.bias",
}
_LLAMA_TOP = {"tok_emb.weight": "model.embed_tokens.weight", "ln_f.g": "model.norm.weight",
              "lm_head.weight": "lm_head.weight"}
_TOP = {
    "gpt2": {"tok_emb.weight": "transformer.wte.weight", "pos_emb.weight": "transformer.wpe.weight",
             "ln_f.g": "transformer.ln_f.weight", "ln_f.b": "transformer.ln_f.bias",
             "lm_head.weight": "lm_head.weight"},
    "gpt_neox": {"tok_emb.weight": "gpt_neox.embed_in.weight", "ln_f.g": "gpt_neox.final_layer_norm.weight",
                 "ln_f.b": "gpt_neox.final_layer_norm.bias", "lm_head.weight": "embed_out.weight"},
    "llama": _LLAMA_TOP, "qwen2": _LLAMA_TOP, "mistral": _LLAMA_TOP, "gemma": _LLAMA_TOP,
}
_BLOCKS = {"gpt2": ("transformer.h", _GPT2_BLOCK), "gpt_neox": ("gpt_neox.layers", _NEOX_BLOCK)}
# families-a
_QK_NORMS = {"attn.q_norm.g": "self_attn.q_norm.weight", "attn.k_norm.g": "self_attn.k_norm.weight"}
_OLMO2_BLOCK = _LLAMA_BLOCK | _QK_NORMS | {  # its two norms act on what each branch writes
    "ln1.g": "post_attention_layernorm.weight", "ln2.g": "post_feedforward_layernorm.weight"}
_PHI_BLOCK = {  # one input_layernorm serves attention and the MLP
    "ln1.g": "input_layernorm.weight", "ln1.b": "input_layernorm.bias",
    **{f"attn.{m}.{p}": f"self_attn.{m}_proj.{p}" for m in "qkv" for p in ("weight", "bias")},
    "attn.out.weight": "self_attn.dense.weight", "attn.out.bias": "self_attn.dense.bias",
    "attn.q_norm.g": "self_attn.q_layernorm.weight", "attn.q_norm.b": "self_attn.q_layernorm.bias",
    "attn.k_norm.g": "self_attn.k_layernorm.weight", "attn.k_norm.b": "self_attn.k_layernorm.bias",
    "mlp.fc.weight": "mlp.fc1.weight", "mlp.fc.bias": "mlp.fc1.bias",
    "mlp.proj.weight": "mlp.fc2.weight", "mlp.proj.bias": "mlp.fc2.bias",
}
_GPTJ_BLOCK = {
    "ln1.g": "ln_1.weight", "ln1.b": "ln_1.bias",
    **{f"attn.{m}.weight": f"attn.{m}_proj.weight" for m in "qkv"}, "attn.out.weight": "attn.out_proj.weight",
    "mlp.fc.weight": "mlp.fc_in.weight", "mlp.fc.bias": "mlp.fc_in.bias",
    "mlp.proj.weight": "mlp.fc_out.weight", "mlp.proj.bias": "mlp.fc_out.bias",
}
_TOP |= {
    "qwen3": _LLAMA_TOP, "olmo2": _LLAMA_TOP,
    "phi": {"tok_emb.weight": "model.embed_tokens.weight", "ln_f.g": "model.final_layernorm.weight",
            "ln_f.b": "model.final_layernorm.bias", "lm_head.weight": "lm_head.weight", "lm_head.bias": "lm_head.bias"},
    "gptj": {"tok_emb.weight": "transformer.wte.weight", "ln_f.g": "transformer.ln_f.weight",
             "ln_f.b": "transformer.ln_f.bias", "lm_head.weight": "lm_head.weight", "lm_head.bias": "lm_head.bias"},
}
_BLOCKS |= {"qwen3": ("model.layers", _LLAMA_BLOCK | _QK_NORMS), "olmo2": ("model.layers", _OLMO2_BLOCK),
            "phi": ("model.layers", _PHI_BLOCK), "gptj": ("transformer.h", _GPTJ_BLOCK)}
# families-b: Gemma 2's sandwich (a norm before and after each branch); SmolLM3 is Llama's layout
_GEMMA2_BLOCK = _LLAMA_BLOCK | {
    "ln1_post.g": "post_attention_layernorm.weight", "ln2.g": "pre_feedforward_layernorm.weight",
    "ln2_post.g": "post_feedforward_layernorm.weight",
}
_TOP |= {"gemma2": _LLAMA_TOP, "smollm3": _LLAMA_TOP, "gemma3_text": _LLAMA_TOP, "qwen3_moe": _LLAMA_TOP,
         "olmoe": _LLAMA_TOP}
# Qwen3-MoE (and OLMoE: the same names, its q/k norms over the whole projection): Qwen3's attention; the MLP a
# router ("gate") and experts whose names _key_map spells out one by one
_MOE_BLOCK = {k: v for k, v in (_LLAMA_BLOCK | _QK_NORMS).items() if not k.startswith("mlp.")}
_MOE_BLOCK |= {"mlp.router.weight": "mlp.gate.weight"}
_EXPERT = {"w_gate.weight": "gate_proj.weight", "w_up.weight": "up_proj.weight", "w_down.weight": "down_proj.weight"}
_BLOCKS |= {"gemma2": ("model.layers", _GEMMA2_BLOCK), "gemma3_text": ("model.layers", _GEMMA2_BLOCK | _QK_NORMS),
            "qwen3_moe": ("model.layers", _MOE_BLOCK), "olmoe": ("model.layers", _MOE_BLOCK)}
_FUSED_QKV = {"gpt2": "attn.c_attn", "gpt_neox": "attention.query_key_value"}


def _key_map(cfg: ModelConfig) -> dict[str, str]:
    """lumen parameter name -> HF name, for every parameter of this config but fused q/k/v."""
    fam = family(cfg)
    prefix, block = _BLOCKS.get(fam, ("model.layers", _LLAMA_BLOCK))
    keys = dict(_TOP[fam])
    for i in range(cfg.n_layers):
        keys.update({f"blocks.{i}.{k}": f"{prefix}.{i}.{v}" for k, v in block.items()})
        for e in range(cfg.n_experts or 0):  # a mixture of experts: each expert's three matrices
            keys.update({f"blocks.{i}.mlp.experts.{e}.{k}": f"{prefix}.{i}.mlp.experts.{e}.{v}"
                         for k, v in _EXPERT.items()})
    return keys


def _is_qkv(name: str) -> bool:
    return ".attn." in name and name.split(".attn.")[1].split(".")[0] in ("q", "k", "v")


def _fuse(parts: list[torch.Tensor], fam: str, cfg: ModelConfig) -> torch.Tensor:
    """W_Q, W_K, W_V (or their biases) as one fused HF tensor: GPT-2 stacks them whole, then stores the
    weight transposed (Conv1D); GPT-NeoX interleaves them head by head."""
    if fam == "gpt2":
        fused = torch.cat(parts)
        return fused.t().contiguous() if fused.dim() == 2 else fused
    h = cfg.n_heads
    per_head = torch.stack([t.reshape(h, cfg.head_dim, *t.shape[1:]) for t in parts], dim=1)  # (h, 3, hd, ...)
    return per_head.reshape(3 * h * cfg.head_dim, *parts[0].shape[1:]).contiguous()


def _unfuse(fused: torch.Tensor, fam: str, cfg: ModelConfig) -> list[torch.Tensor]:
    """The inverse of _fuse: [W_Q, W_K, W_V] (or their biases)."""
    if fam == "gpt2":
        fused = fused.t() if fused.dim() == 2 else fused
        return [t.contiguous() for t in fused.chunk(3, dim=0)]
    h = cfg.n_heads
    per_head = fused.reshape(h, 3, cfg.head_dim, *fused.shape[1:])
    return [per_head[:, j].reshape(h * cfg.head_dim, *fused.shape[1:]).contiguous() for j in range(3)]


def to_hf(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A lumen state dict in Hugging Face's names and layouts (tied weights stored once)."""
    fam, keys, out = family(cfg), _key_map(cfg), {}
    for name, t in state.items():
        if (name == "lm_head.weight" and cfg.tie_embeddings) or (fam in _FUSED_QKV and _is_qkv(name)):
            continue  # tied, or fused below
        hf = keys[name]
        out[hf.rstrip("*")] = t.t().contiguous() if hf.endswith("*") else t
    if fam in _FUSED_QKV:
        prefix = _BLOCKS[fam][0]
        for i in range(cfg.n_layers):
            p = f"blocks.{i}.attn."
            for kind in ("weight", "bias"):
                parts = [state[p + f"{m}.{kind}"] for m in "qkv"]
                out[f"{prefix}.{i}.{_FUSED_QKV[fam]}.{kind}"] = _fuse(parts, fam, cfg)
    return out


def from_hf(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict in lumen's names; raises on missing tensors."""
    fam, keys, out = family(cfg), _key_map(cfg), {}
    hf = _canonical_names(hf, fam)
    if any(k.endswith(("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")) for k in hf):
        hf = _split_phi3(hf, cfg)
    template = GPT.template(cfg)
    for name in template.state_dict():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue
        if fam in _FUSED_QKV and _is_qkv(name):
            i, (m, kind) = int(name.split(".")[1]), name.split(".attn.")[1].split(".")
            fused = _need(hf, f"{_BLOCKS[fam][0]}.{i}.{_FUSED_QKV[fam]}.{kind}")
            out[name] = _unfuse(fused, fam, cfg)["qkv".index(m)]
            continue
        hf_name = keys[name]
        t = _need(hf, hf_name.rstrip("*"))
        out[name] = t.t().contiguous() if hf_name.endswith("*") else t
    if cfg.tie_embeddings:
        head = keys["lm_head.weight"].rstrip("*")
        if head in hf:  # a tied model's file holding an unembedding of its own too
            check_one_unembedding(cfg, {"tok_emb.weight": out["tok_emb.weight"], "lm_head.weight": hf[head]},
                                  "the weights (tie_word_embeddings is true)")
        out["lm_head.weight"] = out["tok_emb.weight"]
    return out


def _split_phi3(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Phi-3's fused projections as Llama's separate ones: qkv_proj stacks W_Q, W_K, W_V (rows), gate_up_proj
    stacks W_gate and W_up."""
    out = {}
    sizes = [cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]
    for k, t in hf.items():
        if k.endswith("self_attn.qkv_proj.weight"):
            if t.dim() != 2 or t.size(0) != sum(sizes):
                raise ModelFileError(f"tensor {k} has shape {tuple(t.shape)}; the config needs {sum(sizes)} rows")
            for m, part in zip("qkv", t.split(sizes)):
                out[k.replace("qkv_proj", f"{m}_proj")] = part.contiguous()
        elif k.endswith("mlp.gate_up_proj.weight"):
            if t.dim() != 2 or t.size(0) != 2 * cfg.hidden:
                raise ModelFileError(f"tensor {k} has shape {tuple(t.shape)}; the config needs {2 * cfg.hidden} rows")
            gate, up = t.chunk(2)
            out[k.replace("gate_up_proj", "gate_proj")], out[k.replace("gate_up_proj", "up_proj")] = gate, up
        else:
            out[k] = t
    return out


def _canonical_names(hf: dict[str, torch.Tensor], fam: str) -> dict[str, torch.Tensor]:
    """Other spellings of the same tensors: GPT-2's original hub file has no `transformer.` prefix
    (`h.0.attn.c_attn.weight`, `wte.weight`); transformers 5 calls GPT-NeoX's `embed_out` `lm_head`."""
    if fam == "gpt2" and "wte.weight" in hf:
        return {k if k.startswith("lm_head.") else f"transformer.{k}": v for k, v in hf.items()}
    if fam == "gpt_neox" and "lm_head.weight" in hf and "embed_out.weight" not in hf:
        return {"embed_out.weight" if k == "lm_head.weight" else k: v for k, v in hf.items()}
    if any(k.endswith(".mlp.experts.gate_up_proj") for k in hf):
        return _experts_one_by_one(hf)
    return hf


def _experts_one_by_one(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5 holds a layer's experts as 3D tensors, gate_up_proj (E, 2 d_ff, d) with each expert's gate
    rows then its up rows, and down_proj (E, d, d_ff); its files (and save_pretrained) have them one by one."""
    out = {}
    for k, t in hf.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            for e, (gate, up) in enumerate(w.chunk(2, dim=0) for w in t.unbind(0)):
                out[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate
                out[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = up
        elif k.endswith(".mlp.experts.down_proj"):
            for e, down in enumerate(t.unbind(0)):
                out[k.replace("down_proj", f"{e}.down_proj.weight")] = down
        else:
            out[k] = t
    return out


def _decided_by(tensor: str) -> str | None:
    """The config.json key that says whether a tensor exists, if one does."""
    if tensor.endswith(("lm_head.weight", "embed_out.weight")):
        return "tie_word_embeddings"
    if "q_layernorm." in tensor or "k_layernorm." in tensor:
        return "qk_layernorm"
    if tensor.endswith(".bias"):
        return "mlp_bias" if ".mlp." in tensor else "attention_bias"
    return None


def _need(hf: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in hf:
        decided = _decided_by(key)
        why = f"config.json's {decided!r} says there is one" if decided else "is config.json the right one?"
        raise ModelFileError(f"the Hugging Face weights have no tensor {key!r} ({why})")
    return hf[key]


# ---------------------------------------------------------------------------------------------
# directories and live models
def from_hf_model(hf_model: PreTrainedModel) -> GPT:
    """A lumen GPT with the weights of a transformers model of one of FAMILIES."""
    cfg = config_from_hf(hf_model.config.to_dict(), name=hf_model.config.model_type)
    state = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    return GPT.from_state(cfg, from_hf(state, cfg), source=f"transformers {type(hf_model).__name__}")


def read_hf_dir(path: str | Path) -> Weights:
    """A Hugging Face-format directory: config.json and model.safetensors, or the shards that
    model.safetensors.index.json lists; tokenizer.json and generation_config.json when it has them."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise MissingFileError(f"{path} has no config.json (expected a Hugging Face model directory)")
    cfg = read_hf_config(path)
    hf: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        hf.update(read_safetensors(f))
    layers = {int(m.group(1)) for k in hf if (m := re.search(r"(?:^|\.)(?:layers|h)\.(\d+)\.", k))}
    if layers != set(range(cfg.n_layers)):
        raise ModelFileError(f"{path}: config.json says {cfg.n_layers} layers but the weights hold layers "
                             f"{sorted(layers)[:8]}{'...' if len(layers) > 8 else ''}; they belong to different models")
    try:
        state = from_hf(hf, cfg)
    except ModelFileError as e:
        raise ModelFileError(f"{path}: {e}") from None
    tok = None
    if (path / "tokenizer.json").is_file():  # (with its tokenizer_config.json, read by Tokenizer.load)
        tok = Tokenizer.load(path)
        tok.check_fits(cfg.vocab_size, str(path / "tokenizer.json"))
    generation = path / GENERATION_CONFIG
    return Weights(cfg, state, str(path), tok, read_generation_config(generation) if generation.is_file() else None)


def read_hf_config(path: Path) -> ModelConfig:
    """The ModelConfig of a Hugging Face directory's config.json (named after the directory)."""
    c = read_json(path / "config.json", "model config")
    try:
        return config_from_hf(c, name=path.name)
    except (ModelFileError, ConfigError) as e:  # (ConfigError: a value out of ModelConfig's ranges)
        raise ModelFileError(f"{path / 'config.json'}: {e}") from None


GENERATION_CONFIG = "generation_config.json"  # a Hugging Face directory's sampling defaults


def read_generation_config(path: Path) -> Sampling | None:
    """The sampling defaults a Hugging Face generation_config.json carries (do_sample false: greedy), over
    lumen's; None if it sets none of them."""
    config = read_json(path, "generation config")
    found = {k: config[k] for k in ("temperature", "top_p", "top_k") if config.get(k) is not None}
    if found.get("top_k") == 0:  # Hugging Face's "no top-k"
        found["top_k"] = None
    if config.get("do_sample") is False:
        found["temperature"] = 0.0
    if not found:
        return None
    try:
        return dataclasses.replace(Sampling(), **found)
    except UserError as e:
        raise ModelFileError(f"{path}: {e} (fix the file, or give --temperature/--top-p/--top-k)") from None


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a Hugging Face directory: the shards model.safetensors.index.json names, or
    model.safetensors. Other *.safetensors files beside them (adapters, old copies) are not the model's."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "weights index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFileError(f"{index} has no weight_map of tensor names to files; the directory is damaged")
        names = set(weight_map.values())
        if not all(isinstance(n, str) and n == Path(n).name and n.endswith(".safetensors") for n in names):
            raise ModelFileError(f"{index}: the weight_map must name .safetensors files in {path}, got "
                                 f"{sorted(map(str, names))[:3]}")
        for n in names:
            if not (path / n).is_file():
                raise MissingFileError(f"{path} lacks {n}, a shard that {index.name} names; download it again")
        check_shard_index(index, weight_map)
        return [path / n for n in sorted(names)]
    if not (path / "model.safetensors").is_file():
        found = ", ".join(sorted(p.name for p in path.glob("*.safetensors"))[:3]) or "none"
        raise MissingFileError(f"{path} has no model.safetensors or model.safetensors.index.json (*.safetensors "
                               f"found: {found}); pickled .bin files are not read: convert them")
    return [path / "model.safetensors"]


def check_shard_index(index: Path, weight_map: dict[str, str]) -> None:
    """A sharded directory's index and its shards agree, read from the shards' headers alone: every tensor is in
    exactly one shard, the one the index names; no shard holds a tensor the index does not name. (Otherwise the
    shard read last would silently win, or a stray copy of another model's tensor would load.)"""
    from safetensors import SafetensorError, safe_open

    held: dict[str, str] = {}
    for shard in sorted(set(weight_map.values())):
        try:
            with safe_open(str(index.parent / shard), "pt") as f:
                names = list(f.keys())
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise ModelFileError(f"{index.parent / shard} is not a readable safetensors file ({reason}): it is "
                                 "truncated or damaged; download it again") from None
        for name in names:
            if name in held:
                raise ModelFileError(f"{index.parent}: tensor {name} is in both {held[name]} and {shard}; the "
                                     "shards disagree (download the model again)")
            held[name] = shard
    for name, shard in weight_map.items():
        if held.get(name) != shard:
            where = f"it is in {held[name]}" if name in held else "no shard holds it"
            raise ModelFileError(f"{index}: puts tensor {name} in {shard}, but {where}; the index and the shards "
                                 "disagree (download the model again)")
    extra = sorted(held.keys() - weight_map.keys())
    if extra:
        raise ModelFileError(f"{index.parent}: {held[extra[0]]} holds tensor(s) {extra[:3]} that {index.name} does not "
                             "name; the index and the shards disagree (download the model again)")


def save_hf_dir(model: GPT, path: str | Path, tokenizer: Tokenizer | None = None) -> Path:
    """Write config.json + model.safetensors (and the tokenizer's files) that transformers' from_pretrained
    loads, into a new or empty directory. Written into a hidden folder beside `path` and renamed into place
    (`files.atomic_dir`), so a failed save leaves nothing half-written."""
    from safetensors.torch import save_file

    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{path} exists and is not an empty directory (choose a new output directory)")
    state = {k: v.detach().cpu().contiguous() for k, v in to_hf(model.state_dict(), model.cfg).items()}
    with atomic_dir(path) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        hf_cfg = config_to_hf(model.cfg) | {"torch_dtype": str(model.dtype).removeprefix("torch.")}
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save(tmp)  # an HF tokenizer: tokenizer_config.json too
    return path


# ---------------------------------------------------------------------------------------------
# the Hugging Face hub
# config and tokenizer json files, and the transformers weights (model.safetensors or its shards), not
# other copies some repositories also hold (consolidated.safetensors, pickles, onnx)
HUB_FILES = ["*.json", "model*.safetensors"]


def hub_cache_dir() -> Path:
    """The standard Hugging Face cache, read from the environment now (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("HF_HOME") or xdg / "huggingface").expanduser() / "hub"


def hub_snapshot(name: str, patterns: list[str] = HUB_FILES) -> Path:
    """The local folder of hub model "ORG/NAME" or "ORG/NAME@REVISION": downloaded into the standard
    Hugging Face cache unless it is there already; with HF_HUB_OFFLINE=1 or no network, from the cache
    only. Only config/tokenizer json files and safetensors weights are fetched (or the files `patterns`
    names: ["config.json"] for the config alone)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, at, revision = name.partition("@")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo) or (at and not revision):
        raise UserError(f"hf:{name}: give hf:ORG/NAME or hf:ORG/NAME@REVISION, e.g. hf:EleutherAI/pythia-70m")
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(repo, revision=revision or None, cache_dir=cache, local_files_only=offline,
                                      allow_patterns=patterns))
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE=1 is set" if offline else "the Hugging Face hub cannot be reached"
        rev = f" --revision {revision}" if revision else ""
        raise MissingFileError(
            f"hf:{name} is not in the Hugging Face cache ({cache}) and {why}: download it where there is network "
            f"access with `hf download {repo}{rev} --include '*.json' 'model*.safetensors'` (same HF_HOME), "
            "or give the path of a local model directory"
        ) from None
    except RevisionNotFoundError:
        raise UserError(f"hf:{name}: the hub has no revision {revision!r} of {repo}") from None
    except RepositoryNotFoundError:
        raise UserError(
            f"hf:{name}: the hub has no model {repo} (or it is private or gated: log in with `hf auth login`)"
        ) from None
    except HfHubHTTPError as e:
        raise FetchError(f"hf:{name}: the hub refused the download ({str(e).splitlines()[0][:160]})") from None
