"""A named activation cache, and reversible surgery on a model, through the hooks of lumen.inspect.hooks.

Every activation has a stable name (the stream after the embedding, and per block i):

    embed                   the residual stream before block 0
    blocks.i.resid_pre      the stream entering block i
    blocks.i.attn_out       what attention writes into the stream
    blocks.i.resid_mid      the stream between attention and the MLP (not in a parallel block)
    blocks.i.mlp_hidden     the MLP's hidden units after the nonlinearity (the input of W2)
    blocks.i.mlp_out        what the MLP writes into the stream
    blocks.i.resid_post     the stream leaving block i
    blocks.i.attn_pattern   the attention weights (B, heads, T, S)
    blocks.i.attn_heads     every head's output side by side, before attn.out writes them into the
                            stream (B, T, heads x head_dim): head h is the slice h*head_dim:(h+1)*head_dim
    final                   the final-normed stream that the unembedding reads

and finer sites, kept when asked for by name (`names.DETAILS`): blocks.i.q, k, v (B, T, heads, d_head),
attn_scores (B, heads, T, S), z (B, T, heads, d_head), ln1_scale and ln2_scale (B, T, 1), mlp_in, mlp_pre, and
final_scale.

    >>> model = GPT.from_preset("baby-gpt", n_layers=4)       # a random model; load() gives trained ones
    >>> idx = torch.tensor([[20, 43, 50, 50, 53]])
    >>> logits, cache = run_with_cache(model, idx)            # or model.run_with_cache(idx)
    >>> cache["blocks.3.resid_post"].shape
    torch.Size([1, 5, 384])
    >>> cache.stack("attn_pattern").shape                      # (blocks, batch, heads, T, T)
    torch.Size([4, 1, 6, 5, 5])

Hooks are added for one call and removed afterwards: a model that is not being inspected runs exactly
the code it always runs. Nothing here changes the model's arithmetic.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn as nn

from .. import names
from ..errors import UserError
from ..model import GPT
from ..tokenizers import Batch
from .hooks import (
    UnknownActivation,
    activation_names,
    check_layer,
    hooked,
    hooks,
    inputs,
    place,
    unknown,
)

__all__ = ["ActivationCache", "UnknownActivation", "activation_names", "capture", "check_layer", "delete_blocks",
           "hooks", "replace_activation", "run_with_cache"]


class ActivationCache(dict):
    """name -> tensor, filled by `run_with_cache`; `stack("resid_post")` gives (n_layers, ...).
    A name it does not hold raises a KeyError (a UserError too) that names the closest ones it does."""

    def __missing__(self, name: str) -> torch.Tensor:
        if not isinstance(name, str):
            raise KeyError(name)
        if names.parse(name).kind in (*names.KINDS, names.EMBED, names.FINAL, names.FINAL_SCALE):
            close = difflib.get_close_matches(name, list(self), n=3, cutoff=0.6)
            also = f"; it holds e.g. {', '.join(repr(c) for c in close)}" if close else ""
            raise UnknownActivation(f"{name!r} is not in this cache (ask run_with_cache for it in names=, "
                                    f"or leave names=None for all){also}")
        raise unknown(name, list(self), " in this cache")

    def stack(self, kind: str) -> torch.Tensor:
        """One per-block activation of every cached block, in block order, stacked along a new first axis."""
        found = sorted((p.layer, k) for k in self if (p := names.parse(k)).kind == kind and p.layer is not None)
        if not found:
            raise UserError(f"no blocks.<i>.{kind} in this cache (was it requested?)")
        return torch.stack([self[k] for _, k in found])

    def streams(self) -> torch.Tensor:
        """The residual stream after every layer: embed, then the output of each block: (n_layers + 1, ...)."""
        return torch.stack([self[names.EMBED]] + list(self.stack("resid_post")))


def run_with_cache(
    model: GPT,
    idx: torch.Tensor | Sequence[int] | Batch,
    names: Iterable[str] | Callable[[str], bool] | None = None,
    device: torch.device | str | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ActivationCache]:
    """Run the model once on token ids idx (B, T) and return (logits, cache of the named activations).

    names: which activations to keep: a list of names, a predicate on the name (over every site:
    `activation_names(model, every=True)`), or None for the default set (`activation_names(model)`).
    Asking for an attn_pattern or attn_scores runs that layer's attention through the plain softmax path
    instead of the fused kernel: the same math, rounded differently (logits agree to ~1e-6, not bit for bit).
    device: where to keep them (e.g. "cpu" to spare accelerator memory); default where they were made.
    mask (B, T): a padded batch's real tokens (or give a `lumen.tokenizers.Batch` as idx); what sits at the
    padding's positions is of no meaning.
    """
    if names is None:
        wanted = activation_names(model)
    elif callable(names):
        wanted = [n for n in activation_names(model, every=True) if names(n)]
    else:
        wanted = list(names)
        for n in wanted:
            place(model, n)  # a clear error for an unknown name before running anything
    idx, mask = inputs(model, idx, mask)
    cache = ActivationCache()

    def keep(a: torch.Tensor, name: str) -> None:
        cache[name] = a.detach().to(device) if device is not None else a.detach()

    with torch.no_grad(), hooked(model, [(n, keep) for n in wanted]):
        logits, _ = model(idx, mask=mask)
    return logits, ActivationCache((n, cache[n]) for n in wanted if n in cache)


class _Captured(Exception):
    """Raised by `capture` to stop the forward pass once the wanted activation exists."""


@torch.no_grad()
def capture(model: GPT, idx: torch.Tensor | Sequence[int] | Batch, name: str, mask: torch.Tensor | None = None
            ) -> torch.Tensor:
    """One named activation for token ids idx (B, T), running the model only as far as needed
    (the blocks above it are never computed).

        >>> model, idx = GPT.from_preset("baby-gpt", n_layers=4), torch.tensor([[1, 2, 3]])
        >>> capture(model, idx, "blocks.3.mlp_hidden").shape      # (B, T, d_ff)
        torch.Size([1, 3, 1536])
    """
    got: list[torch.Tensor] = []

    def stop(a: torch.Tensor, name: str) -> None:
        got.append(a.detach())
        raise _Captured

    idx, mask = inputs(model, idx, mask)
    with hooked(model, [(name, stop)]):
        try:
            model(idx, mask=mask)
        except _Captured:
            pass
    return got[0]


class _Skip(nn.Module):
    """Stands in for a deleted block: the stream passes through unchanged."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        return x


@contextmanager
def delete_blocks(model: GPT, layers: int | Iterable[int]) -> Iterator[GPT]:
    """Run with the given blocks skipped (their writes to the stream removed); restored on exit.

        >>> model, idx = GPT.from_preset("baby-gpt"), torch.tensor([[1, 2, 3]])
        >>> with delete_blocks(model, [5]):
        ...     logits, loss = model(idx, idx)
    """
    layers = sorted({layers} if isinstance(layers, int) else set(layers))
    for i in layers:
        check_layer(model, i)
    saved = {i: model.blocks[i] for i in layers}
    try:
        for i in layers:
            model.blocks[i] = _Skip()
        yield model
    finally:
        for i, block in saved.items():
            model.blocks[i] = block


@contextmanager
def replace_activation(
    model: GPT, name: str, value: torch.Tensor | Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[GPT]:
    """Run with one named activation replaced by a tensor (broadcast to its shape) or by fn(activation).

        >>> model, idx = GPT.from_preset("baby-gpt"), torch.tensor([[1, 2, 3]])
        >>> with replace_activation(model, "blocks.2.mlp_out", lambda a: 0 * a):
        ...     logits, _ = model(idx)
    """
    if place(model, name).where == "readonly":
        raise UserError(f"{name} of a pre-LN block cannot be replaced in place "
                         "(replace the block's attn_out or resid_pre instead)")
    fn = value if callable(value) else (lambda a: value.to(a.dtype).expand_as(a))
    with hooked(model, [(name, lambda a, n: fn(a))]):
        yield model
