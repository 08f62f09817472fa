"""Small GGUF files written with the `gguf` package the way llama.cpp's converter writes them: a tiny
Llama-family lumen model, its tensors under GGUF names with W_Q/W_K rows permuted, a byte-level BPE."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants

from lumen.model import GPT

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (the byte-level BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


TOKENS = SPECIALS + byte_alphabet() + ["".join(m.split(" ")) for m in MERGES]


# the ModelConfig choices of llama.cpp's other architectures (tiny_model(arch=...)): what their files imply
ARCH_FIELDS = {
    "llama": {},
    "qwen2": dict(qkv_bias=True),
    "gemma": dict(mlp="geglu", activation="gelu_tanh", norm="rmsnorm_offset", scale_embeddings=True, d_head=32),
    "phi3": {},
    "qwen3moe": dict(qk_norm="head", n_experts=4, experts_per_token=2, norm_topk_prob=True, d_ff=32),
}


def tiny_model(tie: bool = True, seed: int = 0, arch: str = "llama") -> GPT:
    torch.manual_seed(seed)
    cfg = GPT.from_preset("baby-llama").cfg.replace(**dict(
        vocab_size=len(TOKENS), context=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
        rope_theta=50000.0, norm_eps=2.0**-16, tie_embeddings=tie) | ARCH_FIELDS[arch]  # eps exact in float32
    )
    model = GPT(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a swapped gain would show
        for name, p in model.named_parameters():
            if name.endswith(".g"):
                p.uniform_(0.5, 1.5)
    return model


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to W_Q and W_K rows: interleave each head's two halves."""
    out, d_in = w.shape
    return w.reshape(n_heads, 2, out // n_heads // 2, d_in).swapaxes(1, 2).reshape(out, d_in)


GGUF_NAMES = {"ln1.g": "attn_norm.weight", "attn.q.weight": "attn_q.weight", "attn.k.weight": "attn_k.weight",
              "attn.v.weight": "attn_v.weight", "attn.out.weight": "attn_output.weight", "ln2.g": "ffn_norm.weight",
              "mlp.w_gate.weight": "ffn_gate.weight", "mlp.w_up.weight": "ffn_up.weight",
              "mlp.w_down.weight": "ffn_down.weight"}


QK_NORM_NAMES = {"attn.q_norm.g": "attn_q_norm.weight", "attn.k_norm.g": "attn_k_norm.weight"}
BIAS_NAMES = {"attn.q.bias": "attn_q.bias", "attn.k.bias": "attn_k.bias", "attn.v.bias": "attn_v.bias"}


def gguf_tensors(model: GPT, arch: str = "llama") -> dict[str, np.ndarray]:
    """A lumen model's weights as llama.cpp's converter writes them: GGUF names, W_Q/W_K rows permuted (for
    "llama" only), Gemma's norm gains stored as 1 + g."""
    cfg = model.cfg
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["tok_emb.weight"], "output_norm.weight": sd["ln_f.g"]}
    if not cfg.tie_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = GGUF_NAMES | (BIAS_NAMES if cfg.qkv_bias else {})
    if arch == "qwen3moe":  # no dense MLP: a router and the experts, stacked below
        names = {k: v for k, v in names.items() if not k.startswith("mlp.")} | QK_NORM_NAMES
        names["mlp.router.weight"] = "ffn_gate_inp.weight"
    for i in range(cfg.n_layers):
        for ours, theirs in names.items():
            t = sd[f"blocks.{i}.{ours}"]
            if arch == "llama" and ours in ("attn.q.weight", "attn.k.weight"):
                t = llama_cpp_permute(t, cfg.n_heads if ours == "attn.q.weight" else cfg.kv_heads)
            out[f"blk.{i}.{theirs}"] = t
        if arch == "phi3":  # W_Q, W_K, W_V in one tensor, W_gate and W_up in another (gate rows first)
            for fused, parts in (("attn_qkv.weight", ("attn_q", "attn_k", "attn_v")),
                                 ("ffn_up.weight", ("ffn_gate", "ffn_up"))):
                out[f"blk.{i}.{fused}"] = np.concatenate([out.pop(f"blk.{i}.{p}.weight") for p in parts])
        if arch == "qwen3moe":  # each kind of expert matrix stacked: (experts, out, in)
            for ours, theirs in (("w_gate", "ffn_gate_exps"), ("w_up", "ffn_up_exps"), ("w_down", "ffn_down_exps")):
                out[f"blk.{i}.{theirs}.weight"] = np.stack(
                    [sd[f"blocks.{i}.mlp.experts.{e}.{ours}.weight"] for e in range(cfg.n_experts or 0)])
    if arch == "gemma":
        out = {k: v + 1 if k.endswith("norm.weight") else v for k, v in out.items()}
    return out


def write_gguf(path, model: GPT, types: dict[str, Q] | None = None, arch: str = "llama", pre: str = "smollm",
               extra: dict[str, np.ndarray] | None = None, raw: dict[str, tuple[np.ndarray, Q]] | None = None) -> None:
    """model as a llama.cpp GGUF file; `types` picks a quantization per GGUF tensor name (default F32);
    `extra` adds tensors as they are; `raw` replaces tensors by blocks packed elsewhere ((rows, bytes), type)."""
    cfg, types = model.cfg, types or {}
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.context)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.hidden)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    if cfg.d_head:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if arch == "qwen3moe":
        w.add_expert_count(cfg.n_experts)
        w.add_expert_used_count(cfg.experts_per_token)
        w.add_expert_feed_forward_length(cfg.hidden)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    tensors = gguf_tensors(model, arch)
    tensors.update(extra or {})
    for name, t in tensors.items():
        kind = types.get(name, Q.F32)
        if name in (raw or {}):
            w.add_tensor(name, raw[name][0], raw_dtype=raw[name][1])  # type: ignore[index]
        elif kind == Q.F32:
            w.add_tensor(name, np.ascontiguousarray(t))
        else:
            w.add_tensor(name, quants.quantize(np.ascontiguousarray(t), kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --- K-quants, packed here from chosen codes (the gguf package writes none of them) ---------------------------
# A K-quant "super-block" holds 256 numbers of one row; the formulas below are ggml's (dequantize_row_q4_K,
# dequantize_row_q6_K), so the numbers a test expects come from the codes, not from any dequantizer.
def pack_q4_k(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, m: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K blocks (n, 144 bytes) for w = d * sc[j] * q - dmin * m[j] over 8 sub-blocks j of 32: d, dmin (n,)
    float16; sc, m (n, 8) in 0..63; q (n, 256) in 0..15."""
    n = len(d)
    s = np.zeros((n, 12), np.uint8)
    s[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    q = q.reshape(n, 4, 2, 32)  # 4 chunks of 64: the first 32 in the low nibbles, the next 32 in the high ones
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128).astype(np.uint8)
    head = np.stack([d, dmin], 1).astype(np.float16).view(np.uint8)
    return np.concatenate([head, s, qs], 1)


def unpack_q4_k_formula(d, dmin, sc, m, q) -> np.ndarray:
    """The numbers Q4_K blocks stand for, in float64: (n, 256)."""
    scale = np.repeat(d.astype(np.float64)[:, None] * sc, 32, 1)
    low = np.repeat(dmin.astype(np.float64)[:, None] * m, 32, 1)
    return scale * q - low


def pack_q6_k(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q6_K blocks (n, 210 bytes) for w = d * sc[i // 16] * (q - 32): d (n,) float16, sc (n, 16) int8, q (n, 256)
    in 0..63. Each half of 128: low 4 bits of values l and l+64 share byte ql[l] (l+32 and l+96: ql[l+32]), the
    high 2 bits of l, l+32, l+64, l+96 share qh[l]."""
    n = len(d)
    q = q.reshape(n, 2, 4, 32).astype(np.uint8)  # (half, quarter, l)
    lo, hi = q & 15, q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], 2)  # (n, 2, 64)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)  # (n, 2, 32)
    tail = np.concatenate([sc.astype(np.int8).view(np.uint8), d.astype(np.float16)[:, None].view(np.uint8)], 1)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), tail], 1)


def unpack_q6_k_formula(d, sc, q) -> np.ndarray:
    return np.repeat(d.astype(np.float64)[:, None] * sc, 16, 1) * (q.astype(np.float64) - 32)
