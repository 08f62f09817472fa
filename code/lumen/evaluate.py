"""How well a model predicts a text: the mean next-token loss over non-overlapping windows.

The token stream is cut into windows of `context` tokens; inside each window every position but the
first is predicted from the ones before it, so each token is scored once, from at most context - 1
tokens of history. A last, shorter window is scored the same way.

    >>> from lumen import ModelConfig
    >>> model = GPT(ModelConfig.from_name("baby-gpt").replace(n_layers=2, d_model=64, n_heads=2))
    >>> r = evaluate(model, list(range(65)) * 4, context=64)
    >>> round(r.loss, 1), r.perplexity == math.exp(r.loss)   # nats per token: untrained, about ln(65) = 4.17
    (4.2, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .errors import UserError
from .model import GPT
from .progress import progress


@dataclass(frozen=True)
class EvalResult:
    loss: float        # mean next-token cross-entropy, nats
    perplexity: float  # exp(loss)
    tokens: int        # tokens in the text
    scored: int        # predictions scored (tokens minus one per window)
    windows: int
    context: int

    def to_dict(self) -> dict:
        return asdict(self)


def windows(n_tokens: int, context: int) -> list[tuple[int, int]]:
    """(start, end) of each non-overlapping window; a window needs two tokens to score anything."""
    if context < 2:
        raise UserError(f"context must be at least 2 tokens to score a prediction, got {context}")
    spans = [(s, min(s + context, n_tokens)) for s in range(0, n_tokens, context)]
    return [(s, e) for s, e in spans if e - s >= 2]


DEFAULT_CONTEXT = 2048  # the default window: the model's context, at most this (logits grow as T x vocab)
LOGITS_BUDGET = 2**28   # logits values per batch of windows (1 GiB in float32)


@torch.inference_mode()
def evaluate(model: GPT, ids: Sequence[int] | torch.Tensor, context: int | None = None) -> EvalResult:
    """Mean next-token loss of `model` on the token ids, window by window (see the module docstring).
    `context` defaults to the model's context, at most DEFAULT_CONTEXT tokens."""
    context = context or min(model.cfg.context, DEFAULT_CONTEXT)
    if context > model.cfg.context:
        raise UserError(f"context {context} exceeds the model's {model.cfg.context} (lower --context)")
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    spans = windows(ids.numel(), context)
    if not spans:
        raise UserError(f"the text has {ids.numel()} token(s); at least 2 are needed to score a prediction")
    device = model.device
    total, scored = 0.0, 0
    batch = max(1, LOGITS_BUDGET // (context * model.cfg.vocab_size))
    full = [s for s in spans if s[1] - s[0] == context]
    groups = [full[i : i + batch] for i in range(0, len(full), batch)] + [[s] for s in spans if s not in full]
    for group in progress(groups, desc="evaluating", unit="batch"):
        x = torch.stack([ids[s:e] for s, e in group]).to(device)      # (B, T)
        logits, _ = model(x[:, :-1])                                  # predict tokens 1..T-1 of each window
        nll = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(), reduction="sum")
        total += nll.item()
        scored += x[:, 1:].numel()
    loss = total / scored
    return EvalResult(loss, math.exp(loss), ids.numel(), scored, len(spans), context)
