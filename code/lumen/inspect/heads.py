"""What each attention head attends to: three scores per head, each the mean attention weight on one
kind of key.

    previous-token   query t -> key t-1                        (a positional head)
    first-token      query t -> key 0                           (a "resting" head, attention sink)
    induction        on a random sequence repeated twice, query t in the second copy -> the key right
                     after the same token's earlier occurrence, t - n + 1  ("copy what came after this
                     last time", Olsson et al. 2022). Random tokens leave nothing else to go on.

    >>> from lumen import ModelConfig
    >>> model = GPT(ModelConfig.from_name("baby-gpt"))       # 6 blocks of 6 heads, untrained
    >>> s = head_scores(model, torch.randint(0, 65, (2, 32)), n_random=2, half=16)
    >>> {k: tuple(v.shape) for k, v in s.items()}            # a score per (layer, head)
    {'previous_token': (6, 6), 'first_token': (6, 6), 'induction': (6, 6)}
"""

from __future__ import annotations

import torch

from .. import names
from ..errors import UserError
from ..model import GPT
from ..progress import progress
from ..tokenizers import Batch
from .cache import run_with_cache
from .hooks import inputs


def patterns(model: GPT, idx: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Every layer's attention pattern for token ids idx (B, T): (n_layers, B, heads, T, T) (mask: a padded
    batch's real tokens)."""
    wanted = [names.activation(i, "attn_pattern") for i in range(len(model.blocks))]
    _, cache = run_with_cache(model, idx, wanted, mask=mask)
    return cache.stack("attn_pattern")


def repeated_random_tokens(vocab_size: int, n: int, half: int, seed: int = 0) -> torch.Tensor:
    """n sequences (n, 2 * half): half random token ids, then the same ids again."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, vocab_size, (n, half), generator=g)
    return torch.cat([r, r], dim=1)


@torch.no_grad()
def positional_scores(model: GPT, idx: torch.Tensor | Batch, mask: torch.Tensor | None = None
                      ) -> dict[str, torch.Tensor]:
    """Previous-token and first-token scores (n_layers, heads), averaged over queries 2..T-1 of idx (B, T)
    (from query 2 on, the previous and the first token are different keys). A padded batch (a Batch, or
    ids and a mask) counts every prompt's own queries 2.. and its own first token."""
    ids, mask = inputs(model, idx, mask)
    real = mask if mask is not None else torch.ones_like(ids, dtype=torch.bool)
    pos = real.cumsum(-1) - 1                                       # each token's position in its prompt
    if int(real.sum(-1).min()) < 3:
        raise UserError(f"need windows of at least 3 tokens to score heads, got {int(real.sum(-1).min())}")
    a = patterns(model, ids, mask)                                  # (L, B, H, T, T)
    query = real & (pos >= 2)                                       # (B, T): the queries scored
    first = real.int().argmax(-1)                                   # (B,): each prompt's first token's column
    prev = a.diagonal(offset=-1, dim1=-2, dim2=-1)                  # (L, B, H, T-1): query t's weight on key t-1
    on_first = a.gather(-1, first.view(1, -1, 1, 1, 1).expand(*a.shape[:-1], 1))[..., 0]   # (L, B, H, T)
    w = query.to(a.dtype)
    n = w.sum()
    return {"previous_token": (prev * w[None, :, None, 1:]).sum((1, 3)) / n,
            "first_token": (on_first * w[None, :, None]).sum((1, 3)) / n}


@torch.no_grad()
def induction_scores(model: GPT, n: int = 4, half: int = 32, seed: int = 0) -> torch.Tensor:
    """Induction score (n_layers, heads) on n random sequences of `half` tokens, each repeated once."""
    if 2 * half > model.cfg.context:
        raise UserError(f"repeated sequences of 2 x {half} tokens exceed the model's context of {model.cfg.context}")
    idx = repeated_random_tokens(model.cfg.vocab_size, n, half, seed).to(model.device)
    a = patterns(model, idx)                                        # (L, B, H, 2h, 2h)
    # query t (in the second copy, t >= half) -> key t - half + 1: the diagonal at offset -(half - 1)
    diag = a.diagonal(offset=-(half - 1), dim1=-2, dim2=-1)         # queries t = half-1 .. 2h-1
    return diag[..., 1:].mean((1, 3))


def head_scores(model: GPT, text: torch.Tensor | Batch, n_random: int = 4, half: int = 32, seed: int = 0,
                mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """All three scores (n_layers, heads): previous- and first-token on text windows (B, T) (or a padded
    Batch), induction on repeated random tokens."""
    # two passes of unequal size: counted in tokens, so the estimate after the first is the tokens left
    text_tokens = (text.ids if isinstance(text, Batch) else text).numel()
    with progress(total=text_tokens + n_random * 2 * half, desc="scoring heads", unit="token") as bar:
        scores = positional_scores(model, text, mask)
        bar.update(text_tokens)
        scores["induction"] = induction_scores(model, n_random, half, seed)
        bar.update(n_random * 2 * half)
    return {k: v.float().cpu() for k, v in scores.items()}


def summarize(scores: dict[str, torch.Tensor], threshold: float = 0.4) -> dict:
    """Per score: the heads above threshold and the mean relative depth (0 = first block, 1 = last) of
    those heads, to check where positional and induction heads sit."""
    out = {}
    for name, s in scores.items():
        L = s.size(0)
        hits = (s > threshold).nonzero().tolist()
        depth = [layer / max(1, L - 1) for layer, _ in hits]
        best = torch.topk(s.flatten(), min(5, s.numel()))
        out[name] = {
            "heads_above": [[layer, head] for layer, head in hits],
            "mean_depth_above": sum(depth) / len(depth) if depth else None,
            "top": [[int(i) // s.size(1), int(i) % s.size(1), float(v)] for v, i in zip(best.values, best.indices)],
        }
    return out
