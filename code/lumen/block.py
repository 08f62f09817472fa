"""The transformer block: LayerNorm, RMSNorm, the MLP, SwiGLU, and the pre-LN block that stacks them.

This is the listing of the chapter "Layers of Understanding", extended only by small named pieces
(the choice of activation, the post-LN variant, a builder that reads a ModelConfig).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import MultiHeadAttention
from .config import ModelConfig


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))     # gamma: per-dimension gain
        self.b = nn.Parameter(torch.zeros(d))    # beta: per-dimension bias
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: (..., d); statistics over the last axis only
        mu = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mu) / torch.sqrt(var + self.eps) * self.g + self.b


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x / rms * self.g                  # no mean subtraction, no bias


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU through the tanh approximation, as GPT-2 was trained with it."""
    return F.gelu(x, approximate="tanh")


# the element-wise squashing functions the MLP can use (the chapter's "GELU, and why not ReLU")
ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": gelu_tanh, "relu": F.relu, "silu": F.silu}


class MLP(nn.Module):
    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        activation: str = "gelu",
        bias: bool = True,
    ):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.fc = nn.Linear(d_model, d_ff, bias=bias)       # W1: expand
        self.proj = nn.Linear(d_ff, d_model, bias=bias)     # W2: project back
        self.drop = nn.Dropout(dropout)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # a SiLU gate decides how much of each "up" feature passes
        return self.drop(self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)))


def make_norm(cfg: ModelConfig) -> nn.Module:
    return LayerNorm(cfg.d_model, cfg.norm_eps) if cfg.norm == "layernorm" else RMSNorm(cfg.d_model, cfg.norm_eps)


def make_mlp(cfg: ModelConfig) -> nn.Module:
    if cfg.mlp == "swiglu":
        return SwiGLU(cfg.d_model, cfg.hidden, cfg.dropout)
    return MLP(cfg.d_model, cfg.hidden, cfg.dropout, cfg.activation, cfg.bias)


class TransformerBlock(nn.Module):
    """Pre-LN block:  x = x + Attn(LN1(x));  x = x + MLP(LN2(x))

    ``TransformerBlock(d_model, n_heads)`` is the chapter's GPT-2 style block; pass ``cfg`` to take the
    norm, MLP, attention shape and positions from a ModelConfig instead.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        cfg: ModelConfig | None = None,
    ):
        super().__init__()
        if cfg is None:
            cfg = ModelConfig(
                d_model=d_model, n_heads=n_heads, d_ff=d_ff, dropout=dropout, activation="gelu"
            )
        self.ln1 = make_norm(cfg)
        self.attn = MultiHeadAttention.from_config(cfg)
        self.ln2 = make_norm(cfg)
        self.mlp = make_mlp(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> TransformerBlock:
        block_type = PostLNBlock if cfg.norm_placement == "post" else cls
        return block_type(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg=cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), mask, cache))   # gather from context, write to stream
        x = x + self.mlp(self.ln2(x))                            # think per token, write to stream
        return x


class PostLNBlock(TransformerBlock):
    """Post-LN block (Vaswani et al. 2017):  x = LN1(x + Attn(x));  x = LN2(x + MLP(x))

    The norm sits on the residual highway, so every block rescales the stream itself.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        x = self.ln1(x + self.drop(self.attn(x, mask, cache)))   # gather, add, renormalise the stream
        x = self.ln2(x + self.mlp(x))                            # think, add, renormalise the stream
        return x
