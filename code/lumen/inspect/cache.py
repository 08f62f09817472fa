"""A named activation cache, and reversible surgery on a model, through plain forward hooks.

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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn

from .. import names
from ..block import ParallelBlock, PostLNBlock, TransformerBlock
from ..errors import UserError
from ..model import GPT, plain_attention

PER_BLOCK = names.ACTIVATIONS


class UnknownActivation(UserError, KeyError):
    """A name that is not an activation of this model (or not in this cache), with the closest valid ones.
    A UserError (one line from the CLI) and a KeyError (what a dict lookup raises)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


def unknown(name: str, valid: list[str], where: str = "") -> UnknownActivation:
    """The error for a wrong name: the valid names closest to it (difflib), or how names are formed."""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else (
        f"names are embed, final and blocks.<i>.<{'|'.join(PER_BLOCK)}>")
    return UnknownActivation(f"unknown activation {name!r}{where}: {hint}")


def activation_names(model: GPT) -> list[str]:
    """Every name the cache knows for this model, in the order the forward pass produces them."""
    found = [names.EMBED]
    for i, block in enumerate(model.blocks):
        parallel = isinstance(block, ParallelBlock)
        found += [names.activation(i, kind) for kind in PER_BLOCK if not (parallel and kind == "resid_mid")]
    return found + [names.FINAL]


def _site(model: GPT, name: str) -> tuple[nn.Module, str]:
    """The module whose input ("pre") or output ("out") is the named activation."""
    if name == names.EMBED:
        return model.drop, "out"
    if name == names.FINAL:
        return model.ln_f, "out"
    i, kind, _ = names.parse(name)
    if i is None or kind not in PER_BLOCK:
        raise unknown(name, activation_names(model))
    check_layer(model, i)
    block = model.blocks[i]
    assert isinstance(block, TransformerBlock)
    post_ln = isinstance(block, PostLNBlock)
    if kind == "resid_pre":
        return block, "pre"
    if kind == "resid_post":
        return block, "out"
    if kind == "attn_out":
        return block.attn, "out"
    if kind == "mlp_out":
        return block.mlp, "out"
    if kind == "attn_pattern":
        return block.attn.pattern, "out"
    if kind == "attn_heads":
        return block.attn.out, "pre"
    if kind == "mlp_hidden":
        return block.mlp.down, "pre"
    # resid_mid: pre-LN reads it through ln2; post-LN's ln1 produces it; a parallel block has none
    if isinstance(block, ParallelBlock):
        raise UserError(f"{name}: block {i} is a parallel block (attention and MLP read the same stream), "
                        "so there is no stream between them; use resid_pre or resid_post")
    return (block.ln1, "out") if post_ln else (block.ln2, "pre_readonly")


def check_layer(model: GPT, layer: int) -> int:
    """layer itself if the model has a block with that index, else a clear ValueError."""
    n = len(model.blocks)
    if not 0 <= layer < n:
        raise UserError(f"layer {layer} is out of range: this model has blocks 0..{n - 1}")
    return layer


def _pattern_layers(wanted: Iterable[str]) -> list[int]:
    return [p.layer for p in map(names.parse, wanted) if p.kind == "attn_pattern" and p.layer is not None]


@contextmanager
def hooks(model: GPT, fns: dict[str, Callable[[torch.Tensor], torch.Tensor | None]]) -> Iterator[None]:
    """Call fns[name](activation) wherever the named activation is produced; a function that returns a
    tensor replaces the activation with it. All hooks are removed on exit.

        >>> model, idx = GPT.from_preset("baby-gpt", n_layers=2), torch.tensor([[1, 2, 3]])
        >>> with hooks(model, {"blocks.0.mlp_out": lambda a: torch.zeros_like(a)}):
        ...     logits, _ = model(idx)
    """
    handles = []

    def on_output(fn):
        return lambda module, args, out: fn(out)

    def on_input(fn, name, readonly):
        def pre(module, args):
            new = fn(args[0])
            if new is None:
                return None
            if readonly:
                raise UserError(f"{name} of a pre-LN block cannot be replaced in place "
                                 "(replace the block's attn_out or resid_pre instead)")
            return (new, *args[1:])
        return pre

    try:
        for name, fn in fns.items():
            module, where = _site(model, name)
            if where == "out":
                handles.append(module.register_forward_hook(on_output(fn)))
            else:
                handles.append(module.register_forward_pre_hook(on_input(fn, name, where == "pre_readonly")))
        with plain_attention(model, _pattern_layers(fns)):
            yield
    finally:
        for h in handles:
            h.remove()


class ActivationCache(dict):
    """name -> tensor, filled by `run_with_cache`; `stack("resid_post")` gives (n_layers, ...).
    A name it does not hold raises a KeyError (a UserError too) that names the closest ones it does."""

    def __missing__(self, name: str) -> torch.Tensor:
        if not isinstance(name, str):
            raise KeyError(name)
        if names.parse(name).kind in (*PER_BLOCK, names.EMBED, names.FINAL):
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
    idx: torch.Tensor,
    names: Iterable[str] | Callable[[str], bool] | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, ActivationCache]:
    """Run the model once on token ids idx (B, T) and return (logits, cache of the named activations).

    names: which activations to keep (a list, or a predicate on the name); default all of them.
    Asking for an attn_pattern runs that layer's attention through the plain softmax path instead of the
    fused kernel: the same math, rounded differently (logits agree to ~1e-6, not bit for bit).
    device: where to keep them (e.g. "cpu" to spare accelerator memory); default where they were made.
    """
    everything = activation_names(model)
    if names is None:
        wanted = everything
    elif callable(names):
        wanted = [n for n in everything if names(n)]
    else:
        wanted = list(names)
        for n in wanted:
            _site(model, n)  # a clear error for an unknown name before running anything
    cache = ActivationCache()

    def keep(name):
        def fn(a):
            cache[name] = a.detach().to(device) if device is not None else a.detach()
        return fn

    with torch.no_grad(), hooks(model, {n: keep(n) for n in wanted}):
        logits, _ = model(idx)
    return logits, ActivationCache((n, cache[n]) for n in wanted if n in cache)


class _Captured(Exception):
    """Raised by `capture` to stop the forward pass once the wanted activation exists."""


@torch.no_grad()
def capture(model: GPT, idx: torch.Tensor, name: str) -> torch.Tensor:
    """One named activation for token ids idx (B, T), running the model only as far as needed
    (the blocks above it are never computed).

        >>> model, idx = GPT.from_preset("baby-gpt", n_layers=4), torch.tensor([[1, 2, 3]])
        >>> capture(model, idx, "blocks.3.mlp_hidden").shape      # (B, T, d_ff)
        torch.Size([1, 3, 1536])
    """
    got: list[torch.Tensor] = []

    def stop(a: torch.Tensor) -> None:
        got.append(a.detach())
        raise _Captured

    with hooks(model, {name: stop}):
        try:
            model(idx)
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
    if _site(model, name)[1] == "pre_readonly":
        raise UserError(f"{name} of a pre-LN block cannot be replaced in place "
                         "(replace the block's attn_out or resid_pre instead)")
    fn = value if callable(value) else (lambda a: value.to(a.dtype).expand_as(a))
    with hooks(model, {name: fn}):
        yield model
