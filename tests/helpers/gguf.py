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


def tiny_model(tie: bool = True, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPT.from_preset("baby-llama").cfg.replace(
        vocab_size=len(TOKENS), context=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
        rope_theta=50000.0, norm_eps=2.0**-16, tie_embeddings=tie,  # eps exact in float32
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


def gguf_tensors(model: GPT) -> dict[str, np.ndarray]:
    """A lumen model's weights as llama.cpp's converter writes them: GGUF names, W_Q/W_K rows permuted."""
    cfg = model.cfg
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["tok_emb.weight"], "output_norm.weight": sd["ln_f.g"]}
    if not cfg.tie_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layers):
        for ours, theirs in GGUF_NAMES.items():
            t = sd[f"blocks.{i}.{ours}"]
            if ours in ("attn.q.weight", "attn.k.weight"):
                t = llama_cpp_permute(t, cfg.n_heads if ours == "attn.q.weight" else cfg.kv_heads)
            out[f"blk.{i}.{theirs}"] = t
    return out


def write_gguf(path, model: GPT, types: dict[str, Q] | None = None, arch: str = "llama", pre: str = "smollm",
               extra: dict[str, np.ndarray] | None = None) -> None:
    """model as a llama.cpp GGUF file; `types` picks a quantization per GGUF tensor name (default F32);
    `extra` adds tensors as they are."""
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
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    tensors = gguf_tensors(model)
    tensors.update(extra or {})
    for name, t in tensors.items():
        kind = types.get(name, Q.F32)
        if kind == Q.F32:
            w.add_tensor(name, np.ascontiguousarray(t))
        else:
            w.add_tensor(name, quants.quantize(np.ascontiguousarray(t), kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
