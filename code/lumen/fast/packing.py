"""Faster inference on CPUs, with one copy of the weights: linear layers whose one-row products compile
into fused loops, and whose weights can move into oneDNN's blocked layout for eager decoding.

Two fast paths want two layouts. Compiled, a product of one row (a decoded token) is written as plain
multiply-and-sum (`row_linear`), which the compiler fuses into loops that stream the usual (out, in)
weights faster than any library kernel. Eager, `F.linear` on one row either reorders the whole matrix
into oneDNN's layout on every call (bfloat16) or streams it slowly (float32); a weight reordered once
(`packed`) avoids both. So the steps are explicit, and neither keeps a second copy:

    >>> with Changes() as changes:                                                    # doctest: +SKIP
    ...     fast_linears(model, changes)          # nn.Linear -> FastLinear: the same parameters, no memory
    ...     changes.enter_context(packed(model))  # eager decoding: weights in oneDNN's layout only
    ...     tokens = model.generate(ids, 64, temperature=0)

lumen.fast.decoding does both around a decoding run, and undoes them when it ends (changes.py).

Inside `packed`, each linear weight (except ones shared with another layer, like a tied unembedding,
which the embedding needs plain) lives only in the packed layout; `state_dict()` derives the plain
tensor from it, and on leaving the plain weights come back bit for bit. The packed product gives the
same bits as `F.linear` in bfloat16 and the same numbers to float32 rounding (another summation order).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runtime import cpu
from . import kernels
from .changes import Changes

# whether this PyTorch has oneDNN's packed linear: asked once, here (torch.compile cannot trace the question,
# and a compiled prompt that asked it would break its graph and run eager)
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def can_pack(model: nn.Module) -> bool:
    """True where packing pays: float32 or bf16 weights on a CPU whose PyTorch has oneDNN's packed linear;
    bf16 only where the CPU runs oneDNN's bf16 kernels (cpu.onednn_bf16: elsewhere its reorder raises, and
    F.linear's own bf16 product runs, giving the same tokens)."""
    p = next(model.parameters(), None)
    if not ONEDNN or p is None or p.device.type != "cpu":
        return False
    return p.dtype == torch.float32 or (p.dtype == torch.bfloat16 and cpu.onednn_bf16())


class FastLinear(nn.Linear):
    """nn.Linear for inference: one-row products fused when compiled; the weight packed while in `packed`."""

    _packed: torch.Tensor | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> FastLinear:
        """A FastLinear holding linear's Parameter objects themselves (no copy, no initialisation: ties to
        other layers stay ties)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer.train(linear.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            if x.dtype == self._packed.dtype and x.is_contiguous() and not torch.compiler.is_compiling():
                return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
            return F.linear(x, self._packed.to_dense(), self.bias)  # F.linear rounds a strided input differently
        if torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad):
            return F.linear(x, self.weight, self.bias)
        rows = x.shape[:-1].numel()
        if rows == 1 and torch.compiler.is_compiling():
            return row_linear(x, self.weight, self.bias)  # a reduction the compiler fuses
        if (rows > 1 and x.dtype == self.weight.dtype == torch.float32 and x.is_contiguous() and can_pack(self)
                and not torch.is_autocast_enabled(x.device.type)):
            return kernels.onednn_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def pack(self) -> None:
        """Move the weight into oneDNN's layout (the plain tensor becomes an empty placeholder)."""
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self.weight.data = self.weight.data.new_empty(0)

    def unpack(self) -> None:
        """Back to the plain (out, in) weight, the same bits as before `pack`."""
        assert self._packed is not None, "unpack() of a layer that was not packed"
        self.weight.data = self._packed.to_dense()
        self._packed = None

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._packed is not None:
            destination[prefix + "weight"] = self._packed.to_dense()


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias for a single row, written as products summed along each weight row.

    Each output is one dot product; inductor compiles all of a decoding step's dot products into loops
    that stream the weights at close to the memory's speed. Products and sums are float32
    whatever the weights' dtype (a bf16 x bf16 product is exact in float32), as in the packed product;
    the order of the sum differs, so results agree to float32 rounding."""
    y = (x.float().unsqueeze(-2) * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def fast_linears(model: nn.Module, changes: Changes | None = None) -> int:
    """Replace every nn.Linear inside model by a FastLinear with the same parameters; returns how many.
    Recorded in `changes` (the very nn.Linear layers back when they end); without it, for good."""
    changes = changes or Changes()
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                changes.set(parent, name, FastLinear.from_linear(child))
                n += 1
    return n


@contextlib.contextmanager
def packed(model: nn.Module) -> Iterator[int]:
    """While inside, the FastLinear weights of a (CPU, inference) model live only in oneDNN's layout: faster
    eager one-row products. Yields how many were packed; a model that cannot pack (other device or dtype)
    runs as it is. Weights shared with another layer stay plain. Not for training or compiling inside."""
    if not can_pack(model):
        yield 0
        return
    owners = collections.Counter(id(p) for m in model.modules() for p in m._parameters.values() if p is not None)
    layers = [m for m in model.modules()
              if isinstance(m, FastLinear) and m._packed is None and owners[id(m.weight)] == 1]
    try:
        for layer in layers:
            layer.pack()
        yield len(layers)
    finally:
        for layer in layers:
            if layer._packed is not None:
                layer.unpack()
