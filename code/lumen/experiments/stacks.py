"""Stacks the chapter argues against, built from lumen's own parts: a plain stack (x = f(x), no
residual add) and an attention-only stack (no MLP). Used by the depth and mixing experiments.

    >>> model = build(ModelConfig(vocab_size=84, context=64, d_model=64, n_layers=8, n_heads=4), "plain")
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..attention import MultiHeadAttention, Padding
from ..block import TransformerBlock, make_norm
from ..config import ModelConfig
from ..errors import UserError
from ..model import GPT

KINDS = ("residual", "plain", "plain-unnormed", "attention-only")


class PlainBlock(TransformerBlock):
    """The same sub-blocks without the highway:  x = Attn(LN1(x));  x = MLP(LN2(x)).

    Each layer replaces the stream instead of adding to it, so the gradient reaching the bottom is a
    product of every layer's Jacobian, with no identity term to carry it."""

    def forward(self, x: torch.Tensor, mask: Padding | None = None, cache=None) -> torch.Tensor:
        x = self.drop(self.attn(self.ln1(x), mask, cache))   # gather from context, replace the stream
        x = self.mlp(self.ln2(x))                            # think per token, replace the stream
        return x


class AttentionOnlyBlock(nn.Module):
    """Half a block:  x = x + Attn(LN1(x)).  It can move information between tokens but has no per-token
    nonlinear computation of its own (only the softmax that chooses the weights, and the norms)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = make_norm(cfg)
        self.attn = MultiHeadAttention.from_config(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        return x + self.drop(self.attn(self.ln1(x), mask, cache))   # gather from context, write to stream


def build(cfg: ModelConfig, kind: str = "residual", residual_rule: bool = True) -> GPT:
    """A GPT whose blocks are residual (lumen's own), plain (norms inside f), plain-unnormed or
    attention-only, initialised as GPT-2: N(0, 0.02^2) weights, and the stream-writing matrices at
    0.02 / sqrt(number of writes) when residual_rule (a plain stack has no stream to protect, so its
    projections stay at 0.02)."""
    if kind not in KINDS:
        raise UserError(f"unknown stack kind {kind!r}; choose one of {', '.join(KINDS)}")
    model = GPT(cfg)
    if kind in ("plain", "plain-unnormed"):
        model.blocks = nn.ModuleList(PlainBlock.from_config(cfg) for _ in range(cfg.n_layers))
        if kind == "plain-unnormed":   # x = MLP(Attn(x)): nothing rescales the signal between layers
            for b in model.blocks:
                b.ln1, b.ln2 = nn.Identity(), nn.Identity()
    elif kind == "attention-only":
        model.blocks = nn.ModuleList(AttentionOnlyBlock(cfg) for _ in range(cfg.n_layers))
    model.blocks.apply(model._init_weights)
    # the matrices that write into the stream: attention's W_O and the MLP's W_2 (attention-only: W_O alone)
    # (every block is of the class built above; the isinstance tells a type checker which one)
    writes = [b.attn.out for b in model.blocks if isinstance(b, AttentionOnlyBlock)] if kind == "attention-only" else [
        lin for b in model.blocks if isinstance(b, TransformerBlock) for lin in (b.attn.out, b.mlp.down)]
    std = 0.02 / math.sqrt(len(writes)) if residual_rule and not kind.startswith("plain") else 0.02
    for lin in writes:
        nn.init.normal_(lin.weight, mean=0.0, std=std)
    return model
