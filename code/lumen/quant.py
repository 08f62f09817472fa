"""Decoding from a GGUF file's own quantized weights: the blocks exactly as stored, no re-quantization.

llama.cpp stores a weight row in blocks of 32 numbers. A Q8_0 block is a scale d (float16) and 32
signed 8-bit codes q: w = d q. A Q4_1 block is a scale d, a minimum m (float16) and 32 4-bit codes
q in 0..15 (two to a byte): w = d q + m. A decoded token reads every weight once, so the bytes per
weight bound its speed: ~1.1 here (4-bit codes kept one to a byte, plus the block's numbers) against
4 for float32. For one input row x, a product regroups per block, so no weight is ever materialised:

    y_o = sum over blocks b and their j of  q_obj (d_ob x_bj)  +  sum over b of  m_ob (sum_j x_bj)

which torch.compile turns into fused loops over the codes. Many rows (a prompt) are cheaper with the
weight dequantized once per product and a matrix product.

    >>> model, tok = load_gguf_quantized(fetch("smollm2"))        # doctest: +SKIP
    >>> model.generate(ids, 64, temperature=0, compile=True)      # doctest: +SKIP

The logits are those of the dequantized float32 model (`formats.gguf.load_gguf`) to float32 rounding:
the same numbers, summed in another order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BLOCK = 32  # numbers per block, for both types


class Blocks(nn.Module):
    """A (out, in) matrix as the file's blocks: codes (out, in) as small integers, per block a scale and, for
    Q4_1, a minimum (out, in / 32), in float32 (exact: they are float16 in the file)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None):
        super().__init__()
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("minimum", minimum)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantized(self) -> torch.Tensor:
        """The float32 matrix w = d q (+ m), as llama.cpp (and the gguf package) compute it."""
        out, n = self.codes.shape
        w = self.codes.view(out, n // BLOCK, BLOCK).float() * self.scale[..., None]
        if self.minimum is not None:
            w = w + self.minimum[..., None]
        return w.reshape(out, n)

    def row_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ w.T for one row x (..., in), computed from the blocks (see the module docstring). The scale
        multiplies x inside one sum over all of a row's codes (one long reduction per output, which the
        compiler vectorises; a sum per block would end every 32 numbers in a horizontal add)."""
        out, n = self.codes.shape
        xb = x.float().reshape(n // BLOCK, BLOCK)
        y = (self.codes.view(out, n // BLOCK, BLOCK).float() * (self.scale[..., None] * xb)).sum((-2, -1))
        if self.minimum is not None:
            y = y + (self.minimum * xb.sum(-1)).sum(-1)
        return y.reshape(*x.shape[:-1], out)


class QuantLinear(nn.Module):
    """A bias-free linear layer whose weight stays in the file's blocks."""

    def __init__(self, blocks: Blocks):
        super().__init__()
        self.blocks = blocks
        self.out_features, self.in_features = blocks.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1:
            return self.blocks.row_product(x).to(x.dtype)
        return F.linear(x, self.blocks.dequantized().to(x.dtype))

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized float32 weight, made on demand (for reading; it is not stored)."""
        return self.blocks.dequantized()


class QuantEmbedding(nn.Module):
    """An embedding table kept in blocks: each looked-up row dequantized on the way out."""

    def __init__(self, blocks: Blocks):
        super().__init__()
        self.blocks = blocks

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b = self.blocks
        rows = b.codes[idx].float().unflatten(-1, (-1, BLOCK)) * b.scale[idx][..., None]
        if b.minimum is not None:
            rows = rows + b.minimum[idx][..., None]
        return rows.flatten(-2)

    @property
    def weight(self) -> torch.Tensor:
        return self.blocks.dequantized()


# ---------------------------------------------------------------------------------------------
# reading blocks from a GGUF tensor
def blocks_from_gguf(tensor) -> Blocks | None:
    """The blocks of a Q8_0 or Q4_1 GGUF tensor, as stored (None for any other type)."""
    from gguf import GGMLQuantizationType as Q

    raw = np.asarray(tensor.data, dtype=np.uint8)  # (out, bytes per row)
    out = raw.shape[0]
    if tensor.tensor_type == Q.Q8_0:
        b = raw.reshape(out, -1, 2 + BLOCK)
        scale = b[..., :2].copy().view(np.float16)[..., 0]
        codes = b[..., 2:].copy().view(np.int8).reshape(out, -1)
        return Blocks(torch.from_numpy(codes), torch.from_numpy(scale.astype(np.float32)), None)
    if tensor.tensor_type == Q.Q4_1:
        b = raw.reshape(out, -1, 4 + BLOCK // 2)
        scale = b[..., 0:2].copy().view(np.float16)[..., 0]
        minimum = b[..., 2:4].copy().view(np.float16)[..., 0]
        packed = b[..., 4:]
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(out, -1)  # low nibbles first
        return Blocks(torch.from_numpy(codes), torch.from_numpy(scale.astype(np.float32)),
                      torch.from_numpy(minimum.astype(np.float32)))
    return None


def load_gguf_quantized(path: str | Path):
    """A lumen GPT (eval, float32 activations) whose Q8_0/Q4_1 matrices stay as the file's blocks, and its
    tokenizer. Tensors of other types (norms: F32) are read as `formats.gguf` reads them."""
    from .formats import gguf
    from .model import GPT

    reader = gguf.open_gguf(path)
    meta = gguf.metadata(reader)
    cfg = gguf.config_from_gguf(meta, {t.name for t in reader.tensors},
                                name=str(meta.get("general.name") or Path(path).stem))
    with torch.device("meta"):
        model = GPT(cfg)
    modules = dict(model.named_modules())
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = gguf._lumen_name(t.name)
        if name is None:
            raise gguf.GGUFError(f"tensor {t.name} has no place in lumen's Llama model; this variant is not supported")
        owner = modules.get(name.rsplit(".", 1)[0])
        blocks = blocks_from_gguf(t) if isinstance(owner, (nn.Linear, nn.Embedding)) else None
        if blocks is None:
            state[name] = torch.from_numpy(gguf.dequantize(t))
            if name.endswith(("attn.q.weight", "attn.k.weight")):
                heads = cfg.n_heads if name.endswith("q.weight") else cfg.kv_heads
                state[name] = gguf.unpermute(state[name], heads)
            continue
        if name.endswith(("attn.q.weight", "attn.k.weight")):  # whole rows move: the blocks stay intact
            heads = cfg.n_heads if name.endswith("q.weight") else cfg.kv_heads
            for key in ("codes", "scale", "minimum"):
                if getattr(blocks, key) is not None:
                    setattr(blocks, key, gguf.unpermute(getattr(blocks, key), heads))
        _replace(model, name.rsplit(".", 1)[0], blocks)
    if cfg.tie_embeddings and isinstance(model.tok_emb, QuantEmbedding):
        model.lm_head = QuantLinear(model.tok_emb.blocks)  # the same blocks, read as the unembedding
    elif cfg.tie_embeddings and "tok_emb.weight" in state:
        state["lm_head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state, strict=False, assign=True)
    gguf._materialise_buffers(model, cfg)
    left = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if left:
        raise gguf.GGUFError(f"{Path(path).name} lacks tensors for {left[:3]}; the file is incomplete "
                             "or not a Llama model")
    return model.eval(), gguf.tokenizer_from_gguf(meta)


def _replace(model: nn.Module, path: str, blocks: Blocks) -> None:
    parent_name, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, QuantEmbedding(blocks) if isinstance(old, nn.Embedding) else QuantLinear(blocks))
