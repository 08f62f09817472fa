"""Decoding from a GGUF file's own quantized weights: the blocks exactly as stored, no re-quantization.

llama.cpp stores a weight row in blocks of 32 numbers. A Q8_0 block is a scale d (float16) and 32
signed 8-bit codes q: w = d q. A Q4_1 block is a scale d, a minimum m (float16) and 32 4-bit codes
q in 0..15 (two to a byte): w = d q + m. A decoded token reads every weight once: ~1.25 bytes per
weight here (4-bit codes kept one to a byte, plus the block's numbers in float32) against 4 for
float32. For one input row x, a product regroups per block, so no weight is ever materialised:

    y_o = sum over blocks b and their j of  q_obj (d_ob x_bj)  +  sum over b of  m_ob (sum_j x_bj)

which torch.compile turns into fused loops over the codes. (Measured on one core: these loops are
bound by their arithmetic, a conversion and two products per weight, not by the bytes they read;
llama.cpp instead rounds x to 8 bits and multiplies integers.) Many rows (a prompt), and any
product run eagerly, dequantize a slab of rows at a time for a matrix product.

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
SLAB = 4096  # rows dequantized at a time for a product of many rows


@torch.library.custom_op("lumen::stored", mutates_args=())
def stored(x: torch.Tensor) -> torch.Tensor:
    """x, written out to memory. A product of one row reads each input number once per output row, and
    torch.compile folds a cheap producer into the loop that reads it: the final norm before the
    unembedding would be computed again for each of its 49,152 rows (measured: 10 ms of a 30 ms token).
    The Q4_1 product reads x twice (its codes and its block sums), which makes the compiler store it; a
    Q8_0 product reads it once, so it goes through this op, which the compiler cannot look into."""
    return x.clone()


@stored.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


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

    def dequantized(self, rows: slice = slice(None)) -> torch.Tensor:
        """The float32 matrix w = d q (+ m), as llama.cpp (and the gguf package) compute it (those rows)."""
        codes = self.codes[rows]
        out, n = codes.shape
        w = codes.view(out, n // BLOCK, BLOCK).float() * self.scale[rows, :, None]
        if self.minimum is not None:
            w = w + self.minimum[rows, :, None]
        return w.reshape(out, n)

    def row_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ w.T for one row x (..., in), computed from the blocks (see the module docstring). The scale
        multiplies x inside one sum over all of a row's codes (one long reduction per output, which the
        compiler vectorises; a sum per block would end every 32 numbers in a horizontal add)."""
        out, n = self.codes.shape
        if self.minimum is None:
            x = stored(x)
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
        if torch.compiler.is_compiling() and x.shape[:-1].numel() == 1:
            return self.blocks.row_product(x).to(x.dtype)  # compiled: fused loops over the codes
        # eager, or many rows: a slab of rows at a time, so that a 49k-row unembedding never stands whole
        # in float32 (113 MB, and twice that for the one-row formula run eagerly)
        return torch.cat([F.linear(x, self.blocks.dequantized(slice(i, i + SLAB)).to(x.dtype))
                          for i in range(0, self.out_features, SLAB)], -1)

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
