"""The transformer block: LayerNorm, RMSNorm, the MLP, SwiGLU, and the pre-LN block that stacks them.

This is the listing of the chapter "Layers of Understanding", extended only by small named pieces
(the choice of activation, the post-LN and parallel variants, Gemma's norm and gated GELU, and a
builder that reads a ModelConfig).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import MultiHeadAttention, Padding
from .config import ACTIVATIONS, ModelConfig


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))     # gamma: per-dimension gain
        self.b = nn.Parameter(torch.zeros(d))    # beta: per-dimension bias
        self.eps = eps

    @property
    def gain(self) -> torch.Tensor:
        """The per-dimension factor the normalised stream is multiplied by."""
        return self.g

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x: (..., d); statistics over the last axis only
        mu = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mu) / torch.sqrt(var + self.eps) * self.g + self.b


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.eps = eps

    @property
    def gain(self) -> torch.Tensor:
        return self.g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x / rms * self.g                  # no mean subtraction, no bias


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the gain is 1 + g, so g = 0 (its initial value) is the identity scale."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__(d, eps)
        nn.init.zeros_(self.g)

    @property
    def gain(self) -> torch.Tensor:
        return 1 + self.g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Gemma normalises a bf16 stream in float32 and rounds once at the end (float32 and float64: as they are)
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        rms = torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 / rms * (1 + self.g.to(x32.dtype))).to(x.dtype)


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

    @property
    def down(self) -> nn.Linear:
        """The matrix that writes into the stream (W2), whatever the MLP calls it."""
        return self.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    @property
    def down(self) -> nn.Linear:
        """The matrix that writes into the stream."""
        return self.w_down

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # a SiLU gate decides how much of each "up" feature passes
        return self.drop(self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)))


class GeGLU(SwiGLU):
    """SwiGLU with a GELU gate (Shazeer 2020), as Gemma uses it: the same three matrices."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "gelu_tanh"):
        super().__init__(d_model, d_ff, dropout)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # a GELU gate on each "up" feature
        return self.drop(self.w_down(self.act(self.w_gate(x)) * self.w_up(x)))


def make_norm(cfg: ModelConfig, d: int | None = None) -> nn.Module:
    """The family's norm over d features (default: the stream's d_model)."""
    norm = {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "rmsnorm_offset": OffsetRMSNorm}[cfg.norm]
    return norm(d or cfg.d_model, cfg.norm_eps)


class ProjectionRMSNorm(RMSNorm):
    """RMSNorm of queries (or keys) over all heads together (OLMo-2): one statistic per token for the
    whole projection, a gain per feature. Reads and returns (..., heads, d_head)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(-2)).view_as(x)


def qk_norms(cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
    """The norms of queries and keys before RoPE (cfg.qk_norm), or (None, None): the family's norm over each
    head's d_head features ("head": Qwen3, Gemma 3), or an RMSNorm over the whole projection ("projection": OLMo-2)."""
    if cfg.qk_norm == "head":
        return make_norm(cfg, cfg.head_dim), make_norm(cfg, cfg.head_dim)
    if cfg.qk_norm == "projection":
        return (ProjectionRMSNorm(cfg.n_heads * cfg.head_dim, cfg.norm_eps),
                ProjectionRMSNorm(cfg.kv_heads * cfg.head_dim, cfg.norm_eps))
    return None, None


class MixtureOfExperts(nn.Module):
    """A mixture-of-experts MLP (Qwen3-MoE, OLMoE, Mixtral): many MLPs, of which each token uses a few.

        p = softmax(router(x))             one probability per expert
        top k experts by p, weights w      (renormalised to sum to 1 if norm_topk_prob)
        MoE(x) = sum over the chosen e of  w_e * expert_e(x)

    Every expert is the chapter's SwiGLU (w_gate, w_up, w_down), so a token's MLP is a weighted sum of k
    ordinary MLPs; which k is decided per token. `router_logits` and `choices` are named places for
    lumen.inspect's hooks: the router's scores (..., n_experts) and the experts picked (..., k).
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int, norm_topk_prob: bool = True,
                 dropout: float = 0.0):
        super().__init__()
        self.router = nn.Linear(d_model, n_experts, bias=False)     # one score per expert
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff, dropout) for _ in range(n_experts))
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.router_logits, self.choices = nn.Identity(), nn.Identity()

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts), each (..., k): which experts each token goes to, and how much each counts."""
        p = F.softmax(self.router_logits(self.router(x)), dim=-1, dtype=torch.float32)   # (..., n_experts)
        w, chosen = p.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:            # the chosen experts share the whole weight
            w = w / w.sum(-1, keepdim=True)
        return w.to(x.dtype), self.choices(chosen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, chosen = self.route(x)
        flat, w, chosen = x.reshape(-1, x.size(-1)), w.reshape(-1, self.top_k), chosen.reshape(-1, self.top_k)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):   # gather each expert's tokens, run it once, scatter back weighted
            token, slot = torch.where(chosen == e)
            if token.numel():
                out.index_add_(0, token, expert(flat[token]) * w[token, slot, None])
        return out.view_as(x)


def make_mlp(cfg: ModelConfig) -> nn.Module:
    if cfg.n_experts is not None:
        return MixtureOfExperts(cfg.d_model, cfg.hidden, cfg.n_experts, cfg.experts_per_token, cfg.norm_topk_prob,
                                cfg.dropout)
    if cfg.mlp == "swiglu":
        return SwiGLU(cfg.d_model, cfg.hidden, cfg.dropout)
    if cfg.mlp == "geglu":
        return GeGLU(cfg.d_model, cfg.hidden, cfg.dropout, cfg.activation)
    return MLP(cfg.d_model, cfg.hidden, cfg.dropout, cfg.activation, cfg.bias)


class TransformerBlock(nn.Module):
    """Pre-LN block:  x = x + Attn(LN1(x));  x = x + MLP(LN2(x))

    ``TransformerBlock(d_model, n_heads)`` is the chapter's GPT-2 style block;
    ``TransformerBlock.from_config(cfg)`` is the block a ModelConfig describes.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.ln1 = LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ln2 = LayerNorm(d_model)
        self.mlp = MLP(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    @classmethod
    def from_config(cls, cfg: ModelConfig, layer: int = 0) -> TransformerBlock:
        """Block `layer` of cfg's norm placement (pre, post, parallel, sandwich, ...), holding the family's parts:
        its norm, its attention (heads, positions, this block's window) and its MLP."""
        block_type: type[TransformerBlock] = {
            "pre": cls, "post": PostLNBlock, "parallel": ParallelBlock, "parallel_shared": SharedNormParallelBlock,
            "branch_output": BranchOutputNormBlock, "sandwich": SandwichBlock}[cfg.norm_placement]
        block = block_type.from_parts(make_norm(cfg), MultiHeadAttention.from_config(cfg, *qk_norms(cfg), layer=layer),
                                      make_norm(cfg), make_mlp(cfg), cfg.dropout)
        if isinstance(block, SandwichBlock):  # the norms on each branch's way out
            block.ln1_post, block.ln2_post = make_norm(cfg), make_norm(cfg)
        return block

    @classmethod
    def from_parts(cls, ln1: nn.Module, attn: MultiHeadAttention, ln2: nn.Module, mlp: nn.Module,
                   dropout: float = 0.0) -> TransformerBlock:
        """The block around given parts: the same four names and the same forward as the chapter's
        __init__ builds, without first building its GPT-2 parts (LayerNorm, GELU MLP) to throw away."""
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.ln1, block.ln2, block.mlp = ln1, ln2, mlp  # type: ignore[assignment]  # (any family's norms and MLP)
        block.attn = attn
        block.drop = nn.Dropout(dropout)
        return block

    def forward(self, x: torch.Tensor, mask: Padding | None = None, cache=None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), mask, cache))   # gather from context, write to stream
        x = x + self.mlp(self.ln2(x))                            # think per token, write to stream
        return x


class PostLNBlock(TransformerBlock):
    """Post-LN block (Vaswani et al. 2017):  x = LN1(x + Attn(x));  x = LN2(x + MLP(x))

    The norm sits on the residual highway, so every block rescales the stream itself.
    """

    def forward(self, x: torch.Tensor, mask: Padding | None = None, cache=None) -> torch.Tensor:
        x = self.ln1(x + self.drop(self.attn(x, mask, cache)))   # gather, add, renormalise the stream
        x = self.ln2(x + self.mlp(x))                            # think, add, renormalise the stream
        return x


class ParallelBlock(TransformerBlock):
    """Parallel block (GPT-J, GPT-NeoX/Pythia):  x = x + Attn(LN1(x)) + MLP(LN2(x))

    Attention and the MLP both read the same stream and write into it side by side: the MLP does
    not see what attention wrote in this block (so there is no stream "between" them).
    """

    def forward(self, x: torch.Tensor, mask: Padding | None = None, cache=None) -> torch.Tensor:
        return x + self.drop(self.attn(self.ln1(x), mask, cache)) + self.mlp(self.ln2(x))


class SharedNormParallelBlock(ParallelBlock):
    """Parallel block with one norm (GPT-J, Phi-2):  x = x + Attn(LN(x)) + MLP(LN(x))

    Both branches read the same normalised stream; `ln2` is another name for `ln1`.
    """

    @classmethod
    def from_parts(cls, ln1: nn.Module, attn: MultiHeadAttention, ln2: nn.Module, mlp: nn.Module,
                   dropout: float = 0.0) -> TransformerBlock:
        """The block around ln1, attn and mlp (ln2 is not used: the MLP reads ln1 too)."""
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.ln1, block.attn, block.mlp, block.drop = ln1, attn, mlp, nn.Dropout(dropout)  # type: ignore[assignment]
        return block

    @property
    def ln2(self) -> nn.Module:  # type: ignore[override]  # (a read-only alias here)
        return self.ln1

    def forward(self, x: torch.Tensor, mask: Padding | None = None, cache=None) -> torch.Tensor:
        h = self.ln1(x)                                          # one normalised copy of the stream
        return x + self.drop(self.attn(h, mask, cache)) + self.mlp(h)


class BranchOutputNormBlock(TransformerBlock):
    """Branch-output norm (OLMo-2):  x = x + LN1(Attn(x));  x = x + LN2(MLP(x))

    The branches read the raw stream; each normalises what it writes, so every write has a set scale.
    """

    def forward(self, x: torch.Tensor, mask: Padding | None = None, cache=None) -> torch.Tensor:
        x = x + self.drop(self.ln1(self.attn(x, mask, cache)))   # gather, normalise the write, add it
        x = x + self.ln2(self.mlp(x))                            # think, normalise the write, add it
        return x


class SandwichBlock(TransformerBlock):
    """Sandwich block (Gemma 2 and 3):  x = x + LN1_post(Attn(LN1(x)));  x = x + LN2_post(MLP(LN2(x)))

    A pre-LN block whose branches are normalised on the way out too: what each branch adds to the
    stream has a learned per-dimension size, however large the branch's own output grew.
    """

    ln1_post: nn.Module  # set by from_config
    ln2_post: nn.Module

    def forward(self, x: torch.Tensor, mask: Padding | None = None, cache=None) -> torch.Tensor:
        x = x + self.ln1_post(self.drop(self.attn(self.ln1(x), mask, cache)))   # gather, renormalise, write
        x = x + self.ln2_post(self.mlp(self.ln2(x)))                            # think, renormalise, write
        return x
