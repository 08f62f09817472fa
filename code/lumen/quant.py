"""Decoding from a GGUF file's own quantized weights: the blocks exactly as stored, no re-quantization.

llama.cpp stores a weight row in blocks of 32 numbers. A Q8_0 block is a scale d (float16) and 32
signed 8-bit codes q: w = d q. A Q4_1 block is a scale d, a minimum m (float16) and 32 4-bit codes
q in 0..15 (two to a byte): w = d q + m. A decoded token reads every weight once, so the bytes per
weight bound its speed: ~1.1 here (4-bit codes kept one to a byte, plus the block's numbers) against
4 for float32. For one input row x, a product regroups per block, so no weight is ever materialised:

    y_o = sum over blocks b and their j of  q_obj (d_ob x_bj)  +  sum over b of  m_ob (sum_j x_bj)

which torch.compile turns into fused loops over the codes. Many rows (a prompt) are cheaper with the
weight dequantized once per product and a matrix product.

    >>> model, tok = formats.gguf.load_gguf_quantized(fetch("smollm2"))   # doctest: +SKIP
    >>> model.generate(ids, 64, temperature=0, compile=True)      # doctest: +SKIP

The logits are those of the dequantized float32 model (`formats.gguf.load_gguf`) to float32 rounding:
the same numbers, summed in another order.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BLOCK = 32  # numbers per block, for both types


class Blocks(nn.Module):
    """A (out, in) matrix as the file's blocks: codes (out, in) as small integers, per block a scale and, for
    Q4_1, a minimum (out, in / 32), in float32 (exact: they are float16 in the file)."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor | None

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None):
        super().__init__()
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("minimum", minimum)

    @property
    def shape(self) -> tuple[int, int]:
        out, n = self.codes.shape
        return out, n

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
