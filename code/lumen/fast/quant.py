"""A GGUF's quantized matrices as modules: decoding from the file's own numbers, no re-quantization.

llama.cpp stores a weight row in blocks of 32 numbers. A Q8_0 block is a scale d (float16) and 32
signed 8-bit codes q: w = d q. A Q4_1 block is a scale d, a minimum m (float16) and 32 4-bit codes
q in 0..15 (two to a byte): w = d q + m. A decoded token reads every weight once: ~0.63 bytes per
weight here (the file's packed codes and its float16 scales and minima) against 4 for float32.

One row x (a decoded token) is multiplied as llama.cpp multiplies it: x is rounded to 8 bits per block
of 32 (xq = round(x / dx), dx = max|x| / 127), so that a block's products are integers, summed exactly
and scaled once (the minimum multiplies the exact float sum of x):

    y_o = sum over blocks b of  d_ob dx_b (sum_j q_obj xq_bj)  +  m_ob (sum_j x_bj)

A QuantMatrix keeps its blocks in quads (quads.py: the file's bytes in the order this product reads them).
quant.cpp computes the product with the CPU's byte dot-product instructions (kernels.py builds it once per
machine); `rounded_row_product` is the same formula in torch, its reference and its stand-in where it does not
build. Many rows (a prompt, an evaluation, a lens) multiply the dequantized weights, a slab of rows at a time:
those logits are the dequantized float32 model's (`lumen.formats.load`) to float32 rounding; inside the speed
wing's decoding, a prompt's rows are each rounded as a token's (`rounded_prompts`: llama.cpp's arithmetic, and
its byte products' speed, for a prompt). QuantLinear and
QuantEmbedding are a model's layers made of them (loading.py's `load_quantized` builds such a model);
`share_rows` lets the matrices that multiply one row do it as one stack while decoding.

    >>> loaded = lumen.fast.load_quantized("smollm2")                    # doctest: +SKIP
    >>> loaded.model.blocks[0].attn.q.matrix                             # doctest: +SKIP
    QuantMatrix(576 x 576, Q4_1)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import kernels
from .changes import Changes
from .quads import BLOCK, ROWS, SLAB, block_codes, pack, unpack


class QuantMatrix(nn.Module):
    """A (out, in) matrix as the file's blocks: per block of 32 numbers of a row, its codes (Q8_0: int8, one a
    number; Q4_1: 0..15, two a byte, a block's numbers 0-15 in the low halves of its 16 bytes and 16-31 in the
    high halves), its scale and, for Q4_1, its minimum (the file's float16). Kept in quads (quads.py): the file's
    bytes in the order a decoded token's product reads them. `file_rows` gives them in the file's layout."""

    quads: torch.Tensor

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None,
                 into: torch.Tensor | None = None):
        super().__init__()
        if scale.dtype != torch.float16 or (minimum is not None and minimum.dtype != torch.float16):
            raise ValueError("a block's scale and minimum are the file's float16 numbers")
        self.out, self.row_blocks, self.kind = scale.shape[0], scale.shape[1], "Q8_0" if minimum is None else "Q4_1"
        self.register_buffer("quads", pack(codes, scale, minimum, into))  # (into: a place in a model's one buffer)
        kernels.load()  # built (or found wanting) now, at load time, not while torch.compile traces

    @classmethod
    def stack(cls, parts: list[QuantMatrix]) -> QuantMatrix:
        """One matrix of the parts' rows, one part after another (each a multiple of 4 rows): the parts' quads
        become views of its quads (no memory added). Parts that lie one after another in memory already (a
        model's one buffer, `load_quantized`) stay where they are: the stack is a view of them."""
        assert all(p.out % ROWS == 0 and (p.kind, p.row_blocks) == (parts[0].kind, parts[0].row_blocks) for p in parts)
        stacked = cls.__new__(cls)
        nn.Module.__init__(stacked)
        stacked.out, stacked.row_blocks, stacked.kind = sum(p.out for p in parts), parts[0].row_blocks, parts[0].kind
        first, width = parts[0].quads, parts[0].quads.shape[1]
        adjacent = all(a.quads.untyped_storage().data_ptr() == b.quads.untyped_storage().data_ptr()
                       and a.quads.data_ptr() + a.quads.nbytes == b.quads.data_ptr() for a, b in zip(parts, parts[1:]))
        quads = (first.as_strided((stacked.out // ROWS, width), (width, 1)) if adjacent
                 else torch.cat([p.quads for p in parts]))
        stacked.register_buffer("quads", quads)
        start = 0
        for p in parts:
            p.quads = stacked.quads[start: start + p.out // ROWS]
            start += p.out // ROWS
        return stacked

    @property
    def shape(self) -> tuple[int, int]:
        return self.out, self.row_blocks * BLOCK

    def file_rows(self, rows: slice | torch.Tensor = slice(None)) -> tuple[torch.Tensor, torch.Tensor,
                                                                         torch.Tensor | None]:
        """Those rows (a slice, or a tensor of row indices) as the file holds them: (codes, scale, minimum),
        codes (..., in) int8 for Q8_0, (..., in / 2) uint8 for Q4_1, scale and minimum (..., in / 32)."""
        if isinstance(rows, slice) and rows.step in (None, 1):
            start, stop, _ = rows.indices(self.out)
            first = start // ROWS
            parts = unpack(self.quads[first: -(-max(stop, start) // ROWS)], self.row_blocks, self.kind)
            return tuple(t if t is None else t[start - ROWS * first: stop - ROWS * first] for t in parts)  # type: ignore[return-value]
        index = torch.arange(self.out, device=self.quads.device)[rows]
        parts = unpack(self.quads[index.flatten() // ROWS], self.row_blocks, self.kind)
        pick = torch.arange(index.numel(), device=index.device) * ROWS + index.flatten() % ROWS
        return tuple(t if t is None else t[pick].reshape(*index.shape, -1) for t in parts)  # type: ignore[return-value]

    def dequantized(self, rows: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """The float32 matrix w = d q (+ m), as llama.cpp (and the gguf package) compute it: those rows (a
        slice, or a tensor of row indices: (*idx.shape, in))."""
        codes, scale, minimum = self.file_rows(rows)
        w = block_codes(codes, self.kind).float().mul_(scale[..., None])  # (in place: one buffer of rows)
        if minimum is not None:
            w.add_(minimum[..., None])
        return w.flatten(-2)

    def row_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ w.T for rows x (..., in), each row rounded to 8 bits per block (see the module docstring), one
        row (a decoded token) or many (the speed wing's prompt, `rounded_prompts`): quant.cpp's kernels on CPU
        where they are built (a row of many gets the numbers it would get alone), else `rounded_row_product`."""
        out, n = self.shape
        if x.shape[:-1].numel() == 1:
            row = x.reshape(n).float().contiguous()
            if kernels.loaded() and row.device.type == "cpu":
                y = kernels.row_product(row, self.quads, self.kind)[:out]
            else:
                y = self.rounded_row_product(row)
        else:
            rows = x.reshape(-1, n).float().contiguous()
            if kernels.loaded() and rows.device.type == "cpu":
                y = kernels.rows_product(rows, self.quads, self.kind)[:, :out]
            else:
                y = torch.stack([self.rounded_row_product(r) for r in rows])
        return y.reshape(*x.shape[:-1], out)

    def rounded_row_product(self, x: torch.Tensor) -> torch.Tensor:
        """quant.cpp's formula in torch, for one float32 row x (in,): the same 8-bit x and integer block
        sums (exact in float32: at most 32 x 128 x 127), scaled and summed in another order. A slab of rows
        at a time eagerly; compiled, one fused loop over the codes."""
        out, n = self.shape
        xb = (kernels.stored(x) if torch.compiler.is_compiling() else x).reshape(n // BLOCK, BLOCK)
        step = xb.abs().amax(-1) / 127
        xq = torch.round(xb * torch.where(step > 0, 1 / step, 0)[:, None])
        total = xb.sum(-1)  # each block's float sum, for the minima
        slab = out if torch.compiler.is_compiling() else SLAB
        parts = []
        for i in range(0, out, slab):
            codes, scale, minimum = self.file_rows(slice(i, i + slab))
            sums = (block_codes(codes, self.kind).float() * xq).sum(-1)  # (rows, blocks): integers
            y = (sums * (scale * step)).sum(-1)
            if minimum is not None:
                y = y + (minimum * total).sum(-1)
            parts.append(y)
        return torch.cat(parts)

    def extra_repr(self) -> str:
        return f"{self.out} x {self.row_blocks * BLOCK}, {self.kind}"


class QuantLinear(nn.Module):
    """A bias-free linear layer whose weight stays in the file's blocks. A decoded token's row is rounded to 8
    bits per block (QuantMatrix.row_product); a prompt's many rows multiply the dequantized weights (the float32
    model's numbers), or, with `rounded_prompt` (the speed wing's decoding), are each rounded as a token's row
    is: llama.cpp's arithmetic for a prompt, the byte products' speed."""

    rounded_prompt = False

    def __init__(self, blocks: QuantMatrix):
        super().__init__()
        self.matrix = blocks
        self.out_features, self.in_features = blocks.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1 or self.rounded_prompt:
            return self.matrix.row_product(x).to(x.dtype)  # 8-bit x, integer products
        # many rows: a slab of rows at a time, so that a 49k-row unembedding never stands whole in float32
        return torch.cat([F.linear(x, self.matrix.dequantized(slice(i, i + SLAB)).to(x.dtype))
                          for i in range(0, self.out_features, SLAB)], -1)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.matrix.kind} blocks of {BLOCK}"


def rounded_prompts(model: nn.Module, changes: Changes) -> int:
    """Every QuantLinear layer's prompt multiplied as its decoded tokens are, each row rounded to 8 bits per
    block, by quant.cpp's byte products (recorded in `changes`, undone when they end); returns how many
    layers. Only where the kernels are loaded and the layer is on the CPU: torch's formula for many rows
    would be slower than the dequantized product it replaces."""
    if not kernels.loaded():
        return 0
    layers = [m for m in model.modules() if isinstance(m, QuantLinear) and m.matrix.quads.device.type == "cpu"]
    for layer in layers:
        changes.set(layer, "rounded_prompt", True)
    return len(layers)


class SharedRow(nn.Module):
    """Matrices that multiply the same row x, their blocks stacked row after row (a layer's q, k and v; an
    MLP's gate and up): a decoded token's products of all of them in one pass of the kernel, x rounded once,
    the threads splitting one long product rather than three short ones. Each matrix's blocks become rows of
    the stack (views: no memory added). `share_rows` turns the layers into SharedQuantLinear ones."""

    def __init__(self, layers: list[QuantLinear]):
        super().__init__()
        self.matrix = QuantMatrix.stack([layer.matrix for layer in layers])
        self.sizes = [layer.out_features for layer in layers]
        self.row: torch.Tensor | None = None  # the row whose products wait to be read, and them
        self.products: list[torch.Tensor] = []

    def product(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """The i-th matrix's product of one row x: the stack's product, computed when the first of them asks
        for it with this x (the same tensor, by identity) and let go when the last has read it."""
        if self.row is not x:
            self.row, self.products = x, list(self.matrix.row_product(x).split(self.sizes, -1))
        y = self.products[i]
        if i == len(self.sizes) - 1:
            self.row, self.products = None, []
        return y

    def extra_repr(self) -> str:
        return f"{' + '.join(map(str, self.sizes))} rows of {self.matrix.shape[1]}, one product"


class SharedQuantLinear(QuantLinear):
    """A QuantLinear that takes a decoded token's product from its SharedRow (its i-th matrix); many rows
    multiply its own blocks as a QuantLinear does."""

    shared: SharedRow
    index: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1:
            return self.shared.product(x, self.index).to(x.dtype)
        return super().forward(x)


# the layers that multiply one row: a block's attention (q, k, v) and its gated MLP (gate, up)
SAME_ROW = (("q", "k", "v"), ("w_gate", "w_up"))


def share_rows(model: nn.Module, changes: Changes | None = None) -> int:
    """Every group of QuantLinear layers of one module that multiply the same row (SAME_ROW), of one block
    type and width, made one SharedRow; returns how many groups. Recorded in `changes` (undone when they
    end: plain QuantLinear layers again, their blocks still rows of one stack); without it, for good."""
    changes = changes or Changes()
    n = 0
    for parent in list(model.modules()):
        for names in SAME_ROW:
            layers = [getattr(parent, name, None) for name in names]
            if not all(type(layer) is QuantLinear for layer in layers):
                continue
            if len({(layer.matrix.kind, layer.in_features) for layer in layers}) != 1:  # type: ignore[union-attr]
                continue
            if any(layer.out_features % ROWS for layer in layers):  # type: ignore[union-attr]
                continue  # (a stack's parts are whole quads of rows)
            shared = SharedRow(layers)  # type: ignore[arg-type]
            for i, layer in enumerate(layers):
                changes.set_class(layer, SharedQuantLinear)
                changes.set(layer, "shared", shared)
                changes.set(layer, "index", i)
            n += 1
    return n


class QuantEmbedding(nn.Module):
    """An embedding table kept in blocks: each looked-up row dequantized on the way out."""

    def __init__(self, blocks: QuantMatrix):
        super().__init__()
        self.matrix = blocks

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.matrix.dequantized(idx)

    def extra_repr(self) -> str:
        out, n = self.matrix.shape
        return f"{out} rows of {n}, {self.matrix.kind} blocks of {BLOCK}"
