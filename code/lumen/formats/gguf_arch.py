"""llama.cpp's architectures as data: for each `general.architecture` a GGUF file can name, the ModelConfig
choices it fixes, its tensor names in lumen's, and what llama.cpp's converter (`convert_hf_to_gguf.py`) did to
the weights on the way in.

The metadata keys are `{arch}.<key>` for every architecture (`llama.block_count`, `qwen2.block_count`, ...);
what differs is which keys an architecture writes (Gemma has no `rope.freq_base`: 10000), which tensors it has
(Qwen2's q/k/v biases, Gemma 2's post-branch norms) and three quirks of the converter:
- it interleaves the rows of W_Q and W_K per head for "llama" only (llama.cpp rotates neighbouring pairs there);
- it folds Gemma's 1 into the norm weights (Gemma's RMSNorm scales by 1 + g; the file holds 1 + g);
- for Llama 3.1+ it stores RoPE's rescaling as a tensor, `rope_freqs.weight` (each frequency's divisor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# a GGUF tensor inside block i (blk.i.<name>) -> lumen's parameter name inside blocks.i
LLAMA_BLOCK = {
    "attn_norm.weight": "ln1.g",
    "attn_q.weight": "attn.q.weight",
    "attn_k.weight": "attn.k.weight",
    "attn_v.weight": "attn.v.weight",
    "attn_output.weight": "attn.out.weight",
    "ffn_norm.weight": "ln2.g",
    "ffn_gate.weight": "mlp.w_gate.weight",
    "ffn_up.weight": "mlp.w_up.weight",
    "ffn_down.weight": "mlp.w_down.weight",
}
QKV_BIASES = {"attn_q.bias": "attn.q.bias", "attn_k.bias": "attn.k.bias", "attn_v.bias": "attn.v.bias"}
# the tensors outside the blocks
TOP = {"token_embd.weight": "tok_emb.weight", "output_norm.weight": "ln_f.g", "output.weight": "lm_head.weight"}
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: RoPE's rescaling, read into the config, not a parameter

_LLAMA_FIELDS: dict[str, Any] = dict(mlp="swiglu", activation="silu", norm="rmsnorm", positions="rope", bias=False)


@dataclass(frozen=True)
class Architecture:
    """How one llama.cpp architecture's file maps onto lumen's model."""

    fields: dict[str, Any]  # the ModelConfig choices every file of this architecture has
    block: dict[str, str]  # tensor names inside a block, GGUF's -> lumen's
    norm_eps_key: str = "attention.layer_norm_rms_epsilon"
    permuted_qk: bool = False  # the converter interleaved each head's W_Q, W_K rows ("llama", "smollm3")
    norm_plus_one: bool = False  # the file's norm weights are 1 + g, lumen holds g (Gemma)
    optional: frozenset[str] = field(default_factory=frozenset)  # config-only tensors it may have (rope_freqs)
    # ModelConfig fields read from metadata keys `{arch}.<key>` when the file has them (0 means none)
    meta_fields: dict[str, str] = field(default_factory=dict)
    # fused tensors inside a block, split by rows into lumen's: GGUF name -> lumen names, in row order
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # a mixture of experts' stacked tensors (experts, out, in): GGUF name -> each expert's lumen parameter
    experts: dict[str, str] = field(default_factory=dict)
    d_ff_tensor: str | None = None  # the MLP width read from this tensor's rows, not the metadata (Phi-2)


ARCHITECTURES: dict[str, Architecture] = {
    # Llama 1-3, SmolLM2, Mistral and Mixtral's attention: the converter permutes W_Q/W_K for these
    "llama": Architecture(_LLAMA_FIELDS, LLAMA_BLOCK, permuted_qk=True, optional=frozenset({ROPE_FREQS})),
    # Qwen2 / Qwen2.5: Llama with biases on W_Q, W_K, W_V
    "qwen2": Architecture(_LLAMA_FIELDS | dict(qkv_bias=True), LLAMA_BLOCK | QKV_BIASES),
    # Gemma 1: GELU-gated MLP, norms scaling by (1 + g) (stored as 1 + g), embeddings times sqrt(d_model)
    "gemma": Architecture(
        _LLAMA_FIELDS | dict(mlp="geglu", activation="gelu_tanh", norm="rmsnorm_offset", scale_embeddings=True),
        LLAMA_BLOCK, norm_plus_one=True,
    ),
}

# --- the families lumen gained in issue 35 (families-a, families-b) ------------------------------------------
QK_NORM_TENSORS = {"attn_q_norm.weight": "attn.q_norm.g", "attn_k_norm.weight": "attn.k_norm.g"}
SANDWICH = {"post_attention_norm.weight": "ln1_post.g", "post_ffw_norm.weight": "ln2_post.g"}
# Phi-3 fuses W_Q, W_K, W_V into attn_qkv (rows: every query head, then the key heads, then the value heads)
# and W_gate, W_up into ffn_up (gate rows first)
PHI3_FUSED = {"attn_qkv.weight": ("attn.q.weight", "attn.k.weight", "attn.v.weight"),
              "ffn_up.weight": ("mlp.w_gate.weight", "mlp.w_up.weight")}
_PHI2_BLOCK = {
    "attn_norm.weight": "ln1.g", "attn_norm.bias": "ln1.b",  # one LayerNorm serves attention and the MLP
    **{f"attn_{m}.{p}": f"attn.{m}.{p}" for m in "qkv" for p in ("weight", "bias")},
    "attn_output.weight": "attn.out.weight", "attn_output.bias": "attn.out.bias",
    "ffn_up.weight": "mlp.fc.weight", "ffn_up.bias": "mlp.fc.bias",
    "ffn_down.weight": "mlp.proj.weight", "ffn_down.bias": "mlp.proj.bias",
}
EXPERTS = {"ffn_gate_exps.weight": "w_gate.weight", "ffn_up_exps.weight": "w_up.weight",
           "ffn_down_exps.weight": "w_down.weight"}
# the tensors outside the blocks some of them add
TOP_EXTRA = {"output_norm.bias": "ln_f.b", "output.bias": "lm_head.bias"}
_GEMMA = dict(mlp="geglu", activation="gelu_tanh", norm="rmsnorm_offset", scale_embeddings=True)

# Mixtral converts to "llama" with a router and stacked experts (its top-k weights renormalised, as llama.cpp does)
ARCHITECTURES["llama"] = Architecture(
    _LLAMA_FIELDS | dict(norm_topk_prob=True), LLAMA_BLOCK | {"ffn_gate_inp.weight": "mlp.router.weight"},
    permuted_qk=True, optional=frozenset({ROPE_FREQS}),
    meta_fields={"n_experts": "expert_count", "experts_per_token": "expert_used_count"}, experts=EXPERTS,
)
ARCHITECTURES |= {
    # Qwen3: an RMSNorm on each head's query and key before RoPE
    "qwen3": Architecture(_LLAMA_FIELDS | dict(qk_norm="head"), LLAMA_BLOCK | QK_NORM_TENSORS),
    # OLMo-2: each branch's output normalised before it is added (its files name those norms post_*), q/k norms
    # over the whole projection
    "olmo2": Architecture(
        _LLAMA_FIELDS | dict(norm_placement="branch_output", qk_norm="projection"),
        {k: v for k, v in LLAMA_BLOCK.items() if "norm" not in k} | QK_NORM_TENSORS
        | {"post_attention_norm.weight": "ln1.g", "post_ffw_norm.weight": "ln2.g"},
    ),
    # Phi-3: Llama's math with fused projections (and a window the file gives as attention.sliding_window)
    "phi3": Architecture(
        _LLAMA_FIELDS, {k: v for k, v in LLAMA_BLOCK.items() if k in ("attn_norm.weight", "attn_output.weight",
                                                                      "ffn_norm.weight", "ffn_down.weight")},
        meta_fields={"sliding_window": "attention.sliding_window"}, fused=PHI3_FUSED,
    ),
    # Phi-2: attention and MLP side by side from one LayerNorm, partial RoPE, biases, a biased unembedding
    "phi2": Architecture(
        dict(mlp="mlp", activation="gelu_tanh", norm="layernorm", positions="rope", bias=True,
             norm_placement="parallel_shared", head_bias=True),
        _PHI2_BLOCK, norm_eps_key="attention.layer_norm_epsilon", d_ff_tensor="ffn_up.weight",
    ),
    # Gemma 2: Gemma's parts in a sandwich, soft-capped scores and logits, every other block windowed
    # (llama.cpp: blocks 0, 2, 4, ... slide, as transformers' layer_types say)
    "gemma2": Architecture(
        _LLAMA_FIELDS | _GEMMA | dict(norm_placement="sandwich", layer_types=("sliding", "full")),
        LLAMA_BLOCK | SANDWICH, norm_plus_one=True,
        meta_fields={"attn_softcap": "attn_logit_softcapping", "final_softcap": "final_logit_softcapping",
                     "sliding_window": "attention.sliding_window"},
    ),
    # SmolLM3: Llama whose every 4th block has no RoPE (llama.cpp fixes the 4; the file does not say it)
    "smollm3": Architecture(_LLAMA_FIELDS | dict(rope_layers=(True, True, True, False)), LLAMA_BLOCK,
                            permuted_qk=True),
    # Gemma 3: Gemma 2's sandwich with per-head q/k norms (also stored as 1 + g), five windowed blocks to one
    # full, the windowed ones on RoPE base 10000 (llama.cpp fixes both; the file gives the full blocks' base)
    "gemma3": Architecture(
        _LLAMA_FIELDS | _GEMMA | dict(norm_placement="sandwich", qk_norm="head", rope_local_theta=10000.0,
                                      layer_types=("sliding",) * 5 + ("full",)),
        LLAMA_BLOCK | SANDWICH | QK_NORM_TENSORS, norm_plus_one=True,
        meta_fields={"final_softcap": "final_logit_softcapping", "sliding_window": "attention.sliding_window"},
    ),
    # Qwen3-MoE: Qwen3's attention; the MLP a router and SwiGLU experts (llama.cpp renormalises the top-k
    # weights: norm_topk_prob)
    "qwen3moe": Architecture(
        _LLAMA_FIELDS | dict(qk_norm="head", norm_topk_prob=True),
        {k: v for k, v in LLAMA_BLOCK.items() if not k.startswith("ffn_") or k == "ffn_norm.weight"}
        | QK_NORM_TENSORS | {"ffn_gate_inp.weight": "mlp.router.weight"},
        meta_fields={"n_experts": "expert_count", "experts_per_token": "expert_used_count",
                     "d_ff": "expert_feed_forward_length"},
        experts=EXPERTS,
    ),
    # OLMoE: a pre-LN block with OLMo's q/k norms over the whole projection (llama.cpp: of width d_model, so
    # keys as many heads as queries) and a router over SwiGLU experts, top-k weights as the softmax gave them
    "olmoe": Architecture(
        _LLAMA_FIELDS | dict(qk_norm="projection", norm_topk_prob=False),
        {k: v for k, v in LLAMA_BLOCK.items() if not k.startswith("ffn_") or k == "ffn_norm.weight"}
        | QK_NORM_TENSORS | {"ffn_gate_inp.weight": "mlp.router.weight"},
        meta_fields={"n_experts": "expert_count", "experts_per_token": "expert_used_count"}, experts=EXPERTS,
    ),
}
