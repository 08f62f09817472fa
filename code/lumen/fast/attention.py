"""One query against the KV cache, without copying the keys: the attention of a decoding step.

The chapter's plain path (lumen.attention) gives every query head its own copy of its group's keys and
values (`repeat_interleave`): for a decoded token that is a copy of the whole cache, every layer, every step,
more bytes than the products read. Here the group's query heads share their key head instead: the
queries (B, h, 1, hd) are viewed as (B, h_kv, group, hd), one small product against each key head's slots
gives the scores, one against its values the average. Where the speed wing's kernels are loaded (kernels.py
builds them; on a CPU, in float32), attend.cpp does the same over only the slots the query may see
(`lumen::attend_one`): a compiled step's cache has a fixed number of slots, mostly empty early on; a long
run of slots is read in two halves, on two threads where torch has them, the same bits on one. The
same numbers to float32 rounding (another order of the sums); the pattern is not exposed (lumen.inspect
reads it from the plain path).

    >>> import torch
    >>> from lumen import GPT, ModelConfig
    >>> model = GPT(ModelConfig.from_name("baby-llama")).eval()
    >>> with Changes() as changes:
    ...     one_query_attention(model, changes)     # every layer's attention (how many), while inside
    ...     type(model.blocks[0].attn).__name__
    6
    'OneQueryAttention'
    >>> type(model.blocks[0].attn).__name__
    'MultiHeadAttention'
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import MultiHeadAttention
from . import kernels
from .changes import Changes


class OneQueryAttention(MultiHeadAttention):
    """MultiHeadAttention whose single-query steps share each key head between its group's query heads."""

    def attend_plain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None):
        B, h, T, hd = q.shape
        plain_scores = self.softcap is None and self.scale == 1 / math.sqrt(hd)  # (not Gemma's scale or soft-cap)
        if T != 1 or self.training or allowed is None or allowed.dim() != 2 or not plain_scores:  # a prompt, ...
            return super().attend_plain(q, k, v, allowed)
        if q.device.type == "cpu" and q.dtype == k.dtype == torch.float32 and hd % 8 == 0 and kernels.loaded():
            return kernels.attend_one(q, k, v, allowed)
        group = h // self.n_kv_heads
        qg = q.reshape(B, self.n_kv_heads, group, hd)                        # a group's queries side by side
        if torch.compiler.is_compiling():  # products written as sums, which the compiler fuses into loops
            scores = (qg.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) / math.sqrt(hd)    # (B, h_kv, group, S)
        else:
            scores = qg @ k.transpose(-2, -1) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed.view(1, 1, 1, -1), float("-inf"))
        a = F.softmax(scores, dim=-1).to(v.dtype)
        if torch.compiler.is_compiling():
            return (a.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2).reshape(B, h, 1, hd)
        return (a @ v).reshape(B, h, 1, hd)


def one_query_attention(model: nn.Module, changes: Changes | None = None) -> int:
    """Every MultiHeadAttention inside model answers single queries as OneQueryAttention (the same module,
    the same parameters: only its class changes); returns how many. Recorded in `changes` (the chapter's
    class back when they end); without it, for good."""
    changes = changes or Changes()
    swapped = [m for m in model.modules() if type(m) is MultiHeadAttention]
    for m in swapped:
        changes.set_class(m, OneQueryAttention)
    return len(swapped)
