"""Faster inference on CPUs: every linear layer's weight reordered once into oneDNN's blocked
layout, instead of on every call.

A plain `F.linear` on a CPU either reorders the whole weight matrix into that layout each time it
runs (bfloat16: for one decoded token that reorder costs several times the product itself) or uses
a kernel that streams an (out, in) matrix at about half the memory bandwidth (float32). The packed
product gives the same bits in bfloat16 and the same numbers to float32 rounding (~1e-6 relative:
another summation order); the tests compare both against F.linear.

    >>> model = load("smollm2").model   # doctest: +SKIP  (load packs by itself)
    >>> pack_linears(model)             # doctest: +SKIP

Packing keeps `weight` (state dicts, tied weights and inspection see the usual tensors) and adds the
packed copy beside it (twice the weights' memory); a weight changed in place or replaced afterwards
is noticed and packed again. Inside a torch.compile'd graph a product of many rows (a prefill) is one
custom operator, `lumen::packed_linear`, that runs the packed product; a product of one row (a decoded
token) is written as plain multiply-and-sum (`row_linear`), which the compiler fuses into loops that
read the weights faster than either kernel does.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F


def can_pack(model: nn.Module) -> bool:
    """True where packing pays: float32 or bf16 weights on a CPU whose PyTorch has oneDNN's packed linear."""
    p = next(model.parameters(), None)
    return (
        p is not None and p.device.type == "cpu" and p.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Linear):
    """nn.Linear whose weight also lives in oneDNN's layout; same parameters, same results."""

    def pack(self) -> None:
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self._packed_from = _identity(self.weight)
        _OWNERS[self.weight.data_ptr()] = weakref.ref(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain = (
            x.dtype != self.weight.dtype or x.device.type != "cpu"
            or not x.is_contiguous()  # F.linear rounds a strided input's bias add differently
            or (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))
        )
        if plain:
            return F.linear(x, self.weight, self.bias)
        if torch.compiler.is_compiling():
            if x.shape[:-1].numel() == 1:  # one row (a decoded token): a reduction the compiler fuses
                return row_linear(x, self.weight, self.bias)
            return packed_linear(x, self.weight, self.bias)  # one opaque operator, the packed product at run time
        return self.packed_forward(x)

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None or _identity(self.weight) != self._packed_from:  # new, replaced or changed
            self.pack()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed tensor out (it has no storage to copy) and repack on use."""
        state = dict(self.__dict__)
        state["_packed"] = None
        return state


# which layer holds the packed copy of the weight at each address (a compiled graph passes tensors only)
_OWNERS: dict[int, weakref.ref[PackedLinear]] = {}


@torch.library.custom_op("lumen::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias through the packed copy of weight."""
    owner = _OWNERS.get(weight.data_ptr())
    layer = owner() if owner is not None else None
    if layer is None or layer.weight.data_ptr() != weight.data_ptr():
        return F.linear(x, weight, bias)
    return layer.packed_forward(x)


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.size(0))


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias for a single row, written as products summed along each weight row.

    Each output is one dot product; inductor compiles all of a decoding step's dot products into
    loops that stream the weights at close to the memory's speed, faster than the packed product or
    F.linear do (the README's Speed section has the measured rates). Products and sums
    are float32 whatever the weights' dtype (a bf16 x bf16 product is exact in float32), as in the
    packed product; the order of the sum differs, so results agree to float32 rounding."""
    y = (x.float().unsqueeze(-2) * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _identity(t: torch.Tensor) -> tuple[int, int, int]:
    """Which tensor, which memory, and how often it was changed in place (inference-mode tensors keep
    no count: -1). When any of these moves, the packed copy is stale."""
    try:
        version = t._version
    except RuntimeError:
        version = -1
    return id(t), t.data_ptr(), version


def pack_linears(model: nn.Module) -> int:
    """Turn every nn.Linear of an (inference, CPU) model into a PackedLinear; returns how many."""
    if not can_pack(model):
        return 0
    n = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            module.pack()
            n += 1
    return n


def unpack_linears(model: nn.Module) -> int:
    """Undo pack_linears: plain nn.Linear layers again, the packed copies freed; returns how many."""
    n = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
            del module._packed, module._packed_from
            n += 1
    return n
