"""The read-out: the final norm, then the unembedding, which turn the residual stream into next-token logits.
One object that the lenses, attribution, the residual-stack helpers and patching metrics share.

    >>> model = GPT.from_preset("baby-gpt", n_layers=2)
    >>> readout = Readout(model)
    >>> h = torch.randn(1, 3, 384)
    >>> torch.equal(readout(h), model.lm_head(model.ln_f(h)))        # exactly the model's own read-out
    True
    >>> readout.logits(h, [5, 9]).shape                               # two tokens' logits only
    torch.Size([1, 3, 2])

A soft-capped model (Gemma 2) squashes the logits last, cap * tanh(logits / cap): the read-out applies it
(`__call__`, `logits`: the model's own logits), but it is not linear in the stream, so what the writes of a
stream add up to is the logit before the cap (`linear`): attribution splits that one.

The final norm is not linear, but with its scale s frozen (at the value a forward pass used at that position)
it is: LayerNorm(x) = centre(x) / s * g + b and RMSNorm(x) = x / s * g. `scale(h)` is the s a norm divides h
by; `frozen(c, s)` is the linear part applied to one write c, so that the writes of a stream add up to its
normed value (plus the bias, once).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from ..attention import SoftCap
from ..block import LayerNorm, RMSNorm
from ..errors import UserError
from ..model import GPT

Norm = LayerNorm | RMSNorm | nn.Identity


def _check(norm: nn.Module) -> Norm:
    if not isinstance(norm, (LayerNorm, RMSNorm, nn.Identity)):
        raise UserError(f"a norm's scale needs a LayerNorm or RMSNorm; this model's is {type(norm).__name__}")
    return norm


def norm_scale(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(..., 1): what `norm` divides x (..., d) by: sqrt(var + eps) for LayerNorm, sqrt(mean(x^2) + eps)
    for RMSNorm, 1 for no norm (a post-LN model's final read-out)."""
    norm = _check(norm)
    if isinstance(norm, LayerNorm):
        return torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + norm.eps)
    if isinstance(norm, RMSNorm):
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    return torch.ones_like(x[..., :1])


def normalise(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """norm(x) with its scale given rather than measured: the norm's own formula, so that with
    scale = norm_scale(norm, x) it is norm(x) bit for bit."""
    norm = _check(norm)
    if isinstance(norm, LayerNorm):
        return (x - x.mean(-1, keepdim=True)) / scale * norm.g + norm.b
    if isinstance(norm, RMSNorm):
        return x / scale * norm.gain
    return x / scale


class Readout:
    """The final norm, the unembedding and the logits' soft-cap, if any, of a model (references to its own
    modules, not copies)."""

    def __init__(self, model: GPT):
        self.norm: Norm = _check(model.ln_f)
        self.unembed = model.lm_head
        self.W_U = model.lm_head.weight                   # (V, d): row t reads token t
        self.cap = model.logit_cap if isinstance(model.logit_cap, SoftCap) else None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of a stream h (..., d), as the model computes them (soft-capped, if it caps them)."""
        return self.capped(self.linear(h))

    def linear(self, h: torch.Tensor) -> torch.Tensor:
        """The logits before any soft-cap (..., V): unembed(norm(h)), linear in the normed stream, so the writes of
        a stream add up to them (with the norm's scale frozen). The model's own logits where it has no cap."""
        return self.unembed(self.norm(h))

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits through the model's soft-cap (unchanged without one)."""
        return logits if self.cap is None else self.cap(logits)

    def scale(self, h: torch.Tensor) -> torch.Tensor:
        """(..., 1): the final norm's scale for stream h (the forward pass's, when h is the real final stream)."""
        return norm_scale(self.norm, h)

    @property
    def gain(self) -> torch.Tensor | None:
        """The per-dimension factor of the normed stream (None without a final norm)."""
        return None if isinstance(self.norm, nn.Identity) else self.norm.gain

    @property
    def bias(self) -> torch.Tensor | None:
        """The final norm's bias (LayerNorm's b; None for RMSNorm or no norm)."""
        return self.norm.b if isinstance(self.norm, LayerNorm) else None

    def frozen(self, c: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The final norm's linear part for one write c (..., d) with the scale frozen: centre(c) / s * g
        (RMSNorm: c / s * g), no bias. The writes of a stream, each through it, add up to its normed value
        less the bias."""
        if isinstance(self.norm, LayerNorm):
            c = c - c.mean(-1, keepdim=True)
        gain = self.gain
        return c / scale if gain is None else c / scale * gain

    def reading(self, u: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """w (..., d) such that u . frozen(c, s) = c . w for every write c: the direction along which a
        write is read into the logit u . normed stream (u: a row of W_U, or a difference of two rows).
        Centring a write is the same as centring the read-out, so w = centre(g * u) / s."""
        gu = u if self.gain is None else self.gain.to(u.dtype) * u
        if isinstance(self.norm, LayerNorm):
            gu = gu - gu.mean(-1, keepdim=True)
        return gu / scale

    def bias_share(self, u: torch.Tensor) -> torch.Tensor | None:
        """u . b: what the norm's bias adds to the logit along u (None without a bias)."""
        return None if self.bias is None else (u * self.bias.to(u.dtype)).sum(-1)

    def directions(self, tokens: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The unembedding rows (n, d) of the given token ids."""
        return self.W_U[torch.as_tensor(tokens, dtype=torch.long, device=self.W_U.device).reshape(-1)]

    def logits(self, h: torch.Tensor, tokens: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
        """(..., n): the logits of the given tokens only for stream h (..., d), without the whole vocabulary's."""
        return self.capped(self.norm(h) @ self.directions(tokens).T)

    def logit_diff(self, h: torch.Tensor, a: int | torch.Tensor, b: int | torch.Tensor) -> torch.Tensor:
        """logit[a] - logit[b] of stream h (..., d); a and b token ids, or tensors of ids that broadcast
        against h's leading axes (one pair per row)."""
        normed = self.norm(h)
        if self.cap is not None:  # the cap is not linear: each logit capped, then the difference
            return self.cap((normed * self.W_U[torch.as_tensor(a, device=self.W_U.device)]).sum(-1)) - self.cap(
                (normed * self.W_U[torch.as_tensor(b, device=self.W_U.device)]).sum(-1))
        u = self.W_U[torch.as_tensor(a, device=self.W_U.device)] - self.W_U[torch.as_tensor(b, device=self.W_U.device)]
        return (normed * u).sum(-1)
