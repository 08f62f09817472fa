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
    permuted_qk: bool = False  # the converter interleaved each head's W_Q, W_K rows ("llama" only)
    norm_plus_one: bool = False  # the file's norm weights are 1 + g, lumen holds g (Gemma)
    optional: frozenset[str] = field(default_factory=frozenset)  # config-only tensors it may have (rope_freqs)


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
