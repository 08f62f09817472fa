"""Parameters and FLOPs, by the chapter's formulas and by counting the actual tensors.

The chapter's rules, with d = d_model and biases and norms ignored:
    attention  4 d^2             (GQA: 2 d^2 + 2 d h_kv d_head; heads of width d_head != d / h:
                                  2 d h d_head + 2 d h_kv d_head)
    MLP        8 d^2             (in general 2 d d_ff; SwiGLU and GeGLU 3 d d_ff; a mixture of E SwiGLU
                                  experts E * 3 d d_ff + d E for the router, of which a token uses k experts)
    block      12 d^2
    forward    2 N FLOPs per token, + 4 L d per layer for the attention core at context L
    training   6 N D FLOPs for D tokens

    >>> round(count(ModelConfig.from_name("gpt2")).non_embedding / 1e6)
    85
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from .block import MixtureOfExperts
from .config import ModelConfig
from .model import GPT


@dataclass(frozen=True)
class Formula:
    """Parameter counts of one block by the chapter's formulas (weights only)."""

    attention: int
    mlp: int
    block: int
    non_embedding: int  # n_layers * block


def formula(cfg: ModelConfig) -> Formula:
    d = cfg.d_model
    # W_Q, W_O (h heads of width d_head: d^2 each unless d_head != d / h) + the (maybe shared) W_K, W_V
    attention = 2 * d * cfg.n_heads * cfg.head_dim + 2 * d * cfg.kv_heads * cfg.head_dim
    mlp = (2 if cfg.mlp == "mlp" else 3) * d * cfg.hidden  # gated MLPs (SwiGLU, GeGLU) have three matrices
    if cfg.n_experts is not None:  # a mixture: that many SwiGLU experts, and the router's d x E matrix
        mlp = cfg.n_experts * 3 * d * cfg.hidden + d * cfg.n_experts
    return Formula(attention, mlp, attention + mlp, cfg.n_layers * (attention + mlp))


@dataclass(frozen=True)
class Count:
    """Exact parameter counts of the real tensors, by component; shared tensors counted once."""

    embedding: int  # the token embedding table (a lookup, not a matmul)
    positions: int  # learned position table, 0 with RoPE
    attention: int  # all blocks' q, k, v, out weights and biases
    mlp: int  # all blocks' MLP weights and biases
    norms: int  # all blocks' norms and the final norm
    unembedding: int  # the output projection if untied, else 0 (it is the embedding)
    total: int
    matmul: int  # weights multiplied in a forward pass: the blocks' weight matrices and the output projection
    block: int  # one block's parameters: attention, MLP and the block's own norms, biases included
    active: int  # the parameters one token uses: the total less the experts a mixture does not pick for it

    @property
    def non_embedding(self) -> int:
        """Kaplan et al.'s N: everything but the embedding matrices: the token and position tables, and the
        output projection where it is a matrix of its own (untied, as in Pythia's published counts)."""
        return self.total - self.embedding - self.positions - self.unembedding

    def per_block(self, cfg: ModelConfig) -> int:
        """One block's parameters, with biases and the block's norms (the final norm is not in a block)."""
        return self.block


def count(cfg: ModelConfig) -> Count:
    """Build the model on the meta device (no memory, no init cost) and count its tensors."""
    with torch.device("meta"):
        model = GPT(cfg)
    return count_module(model)


def count_module(model: nn.Module) -> Count:
    """Count a built GPT's parameters by component."""
    groups = dict(embedding=0, positions=0, attention=0, mlp=0, norms=0, unembedding=0)
    # the unembedding is a matmul even when tied to the lookup table
    matmul = model.get_parameter("lm_head.weight").numel()
    block = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks.0."))
    idle = 0  # a mixture of experts' unpicked experts: each token multiplies by the weights of top_k of them only
    for m in model.modules():
        if isinstance(m, MixtureOfExperts):
            idle += (len(m.experts) - m.top_k) * sum(p.numel() for p in m.experts[0].parameters())
    for name, p in model.named_parameters():  # named_parameters() yields a tied tensor once
        n = p.numel()
        if p.dim() == 2 and (".attn." in name or ".mlp." in name):
            matmul += n
        if name.startswith("tok_emb."):
            groups["embedding"] += n
        elif name.startswith("pos_emb."):
            groups["positions"] += n
        elif name.startswith("lm_head."):
            groups["unembedding"] += n
        elif ".attn." in name:
            groups["attention"] += n
        elif ".mlp." in name:
            groups["mlp"] += n
        else:
            groups["norms"] += n
    total = sum(groups.values())
    return Count(**groups, total=total, matmul=matmul, block=block, active=total - idle)


def forward_flops_per_token(cfg: ModelConfig, context: int | None = None) -> dict[str, float]:
    """Forward FLOPs per token: 2 per matmul weight it uses (a mixture of experts: the picked experts' only), and
    the attention core's 4 L d per layer (d: the heads' total width, h d_head)
    (Q K^T and A V at context L, the full L x L square as the kernels compute it)."""
    L = context or cfg.context
    c = count(cfg)
    weights = 2 * (c.matmul - (c.total - c.active))   # (the idle experts' weights are all matrices)
    core = 4 * L * cfg.n_heads * cfg.head_dim * cfg.n_layers
    return {"weights": weights, "attention_core": core, "total": weights + core}


def training_flops(n_params: float, n_tokens: float) -> float:
    """Kaplan et al. (2020): C ~ 6 N D, forward (2 N D) plus backward (4 N D)."""
    return 6 * n_params * n_tokens


def report(cfg: ModelConfig, context: int | None = None) -> dict:
    """Everything `lumen count` prints, as a dict (also its --json output)."""
    f, c = formula(cfg), count(cfg)
    L = context or cfg.context
    fl = forward_flops_per_token(cfg, L)
    return {
        "config": cfg.name,
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "formula": asdict(f),
        "formula_in_d2": {
            "attention": f.attention / cfg.d_model**2,
            "mlp": f.mlp / cfg.d_model**2,
            "block": f.block / cfg.d_model**2,
        },
        "exact": {**asdict(c), "non_embedding": c.non_embedding},
        "exact_per_block": c.per_block(cfg),
        "flops_per_token": {"context": L, **fl},
        # the attention core relative to 2N with N the non-embedding parameters (Kaplan's convention)
        "attention_core_share": fl["attention_core"] / (2 * c.non_embedding),
        "training_flops_per_token": 3 * fl["total"],
    }
