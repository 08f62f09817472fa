"""Faster bfloat16 inference on CPUs: every linear layer's weight reordered once into oneDNN's
blocked layout, instead of on every call.

A plain bf16 `F.linear` on a CPU reorders the whole weight matrix into that layout each time it runs;
for one decoded token that reorder costs several times the matrix product itself. The packed product
gives the same bits (the tests compare them), so packing changes speed, never numbers.

    >>> model = load("smollm2", dtype=torch.bfloat16).model   # doctest: +SKIP  (load packs by itself)
    >>> pack_linears(model)                                   # doctest: +SKIP

Packing keeps `weight` (state dicts, tied weights and inspection see the usual tensors) and adds the
packed copy beside it; a weight changed in place or replaced afterwards is noticed and packed again.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def can_pack(model: nn.Module) -> bool:
    """True where packing pays: bf16 weights on a CPU whose PyTorch has oneDNN's packed linear."""
    p = next(model.parameters(), None)
    return (
        p is not None and p.device.type == "cpu" and p.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Linear):
    """nn.Linear whose bf16 weight also lives in oneDNN's layout; same parameters, same results."""

    def pack(self) -> None:
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self._packed_from = _identity(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain = (
            x.dtype != torch.bfloat16 or x.device.type != "cpu" or self.weight.dtype != torch.bfloat16
            or not x.is_contiguous()  # F.linear rounds a strided input's bias add differently
            or (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))
        )
        if plain:
            return F.linear(x, self.weight, self.bias)
        if self._packed is None or _identity(self.weight) != self._packed_from:  # new, replaced or changed
            self.pack()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed tensor out (it has no storage to copy) and repack on use."""
        state = dict(self.__dict__)
        state["_packed"] = None
        return state


def _identity(t: torch.Tensor) -> tuple[int, int, int]:
    """Which tensor, which memory, and how often it was changed in place (inference-mode tensors keep
    no count: -1). When any of these moves, the packed copy is stale."""
    try:
        version = t._version
    except RuntimeError:
        version = -1
    return id(t), t.data_ptr(), version


def pack_linears(model: nn.Module) -> int:
    """Turn every nn.Linear of an (inference, bf16, CPU) model into a PackedLinear; returns how many."""
    if not can_pack(model):
        return 0
    n = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            module.pack()
            n += 1
    return n
