"""Hooks on named sites: run the model with functions that see, and may replace, any named activation on the
way forward, or its gradient on the way back. The one mechanism the activation cache, `capture`,
`replace_activation`, activation patching and attribution patching are built on.

    >>> model, idx = GPT.from_preset("baby-gpt", n_layers=2), torch.tensor([[1, 2, 3]])
    >>> def knock_out(z, name):                          # z: every head's output (B, T, heads, d_head)
    ...     z = z.clone()
    ...     z[:, :, 3] = 0                               # head 3 writes nothing
    ...     return z
    >>> logits = run_with_hooks(model, idx, fwd_hooks=[("blocks.1.z", knock_out)])
    >>> seen = []
    >>> _ = run_with_hooks(model, idx, fwd_hooks=[(lambda n: n.endswith("resid_post"), lambda a, n: seen.append(n))])
    >>> seen
    ['blocks.0.resid_post', 'blocks.1.resid_post']

A hook function is fn(activation, name) -> a replacement of the same shape, or None to leave it as it is.
Several may sit on one site: they run in the order given, each seeing what the one before returned. A site
is given by its name (`lumen.names`) or by a predicate on the name, which picks among every site of the model
(`activation_names(model, every=True)`). A backward hook fn(gradient, name) sees the gradient of whatever is
differentiated afterwards with respect to that activation, and may replace it.

Hooks are registered for one call and removed afterwards: torch forward hooks on the module that makes each
activation (a tensor hook for a backward one). The norms' scales and the per-head views (q, k, v, z) are read
off the modules' own inputs and outputs, so a model that is not being inspected runs exactly its own code.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import names
from ..block import MixtureOfExperts, ParallelBlock, PostLNBlock, SandwichBlock, TransformerBlock
from ..errors import UserError
from ..model import GPT, plain_attention
from ..tokenizers import Batch
from .readout import norm_scale, normalise

Hook = Callable[[torch.Tensor, str], "torch.Tensor | None"]
Hooks = Sequence[tuple[str | Callable[[str], bool], Hook]]    # [(a name or a predicate on names, fn)]
PER_BLOCK = names.ACTIVATIONS
SCALES = {"ln1_scale": "ln1", "ln2_scale": "ln2"}


class UnknownActivation(UserError, KeyError):
    """A name that is not an activation of this model (or not in this cache), with the closest valid ones.
    A UserError (one line from the CLI) and a KeyError (what a dict lookup raises)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


def unknown(name: str, valid: list[str], where: str = "") -> UnknownActivation:
    """The error for a wrong name: the valid names closest to it (difflib), or how names are formed."""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else (
        f"names are embed, final, final_scale and blocks.<i>.<{'|'.join(names.KINDS)}>")
    return UnknownActivation(f"unknown activation {name!r}{where}: {hint}")


def check_layer(model: GPT, layer: int) -> int:
    """layer itself if the model has a block with that index, else a clear ValueError."""
    n = len(model.blocks)
    if not 0 <= layer < n:
        raise UserError(f"layer {layer} is out of range: this model has blocks 0..{n - 1}")
    return layer


def activation_names(model: GPT, every: bool = False) -> list[str]:
    """The names a cache holds by default (the stream and what is written into it), in a fixed order;
    every=True: every site hooks can reach, in the order the forward pass makes them."""
    found = [names.EMBED]
    for i, block in enumerate(model.blocks):
        parallel, moe = isinstance(block, ParallelBlock), isinstance(block.mlp, MixtureOfExperts)
        found += [names.activation(i, kind) for kind in (names.KINDS if every else PER_BLOCK)
                  if not (parallel and kind == "resid_mid")
                  and kind not in (names.ROUTER if not moe else ("mlp_pre", "mlp_hidden"))]
    if every and not isinstance(model.ln_f, nn.Identity):
        found.append(names.FINAL_SCALE)
    return found + [names.FINAL]


@dataclass(frozen=True)
class Place:
    """Where a named activation is made: the module's output ("out"), its first input ("pre"; "readonly":
    an input that is not the stream itself, so it can be read but not replaced), or the scale a norm
    divides its input by ("scale"). heads: the activation is (B, T, heads x d_head), shown as (B, T, heads, d_head)."""

    module: nn.Module
    where: str
    heads: int | None = None


def place(model: GPT, name: str) -> Place:
    """Where the named activation is made, or a clear error for a name this model does not have."""
    if name == names.EMBED:
        return Place(model.drop, "out")
    if name == names.FINAL:
        return Place(model.ln_f, "out")
    if name == names.FINAL_SCALE:
        if isinstance(model.ln_f, nn.Identity):
            raise UserError("final_scale: this model has no final norm (post-LN blocks normalise the stream "
                            "themselves); ask for a block's ln1_scale or ln2_scale")
        return Place(model.ln_f, "scale")
    i, kind, _ = names.parse(name)
    if i is None or kind not in names.KINDS:
        raise unknown(name, activation_names(model, every=True))
    check_layer(model, i)
    block = model.blocks[i]
    assert isinstance(block, TransformerBlock)
    attn = model.attention(i)
    simple: dict[str, Place] = {
        "resid_pre": Place(block, "pre"), "resid_post": Place(block, "out"), "attn_out": Place(attn, "out"),
        "mlp_out": Place(block.mlp, "out"), "attn_pattern": Place(attn.pattern, "out"),
        "attn_scores": Place(attn.scores, "out"), "attn_heads": Place(attn.out, "pre"),
        "z": Place(attn.out, "pre", attn.n_heads), "q": Place(attn.q, "out", attn.n_heads),
        "k": Place(attn.k, "out", attn.n_kv_heads), "v": Place(attn.v, "out", attn.n_kv_heads),
    }
    simple |= {"q_normed": Place(attn.q_norm, "out"), "k_normed": Place(attn.k_norm, "out")}  # (B, T, heads, d_head)
    if isinstance(block, SandwichBlock):  # what is added to the stream: each branch after its norm on the way out
        simple |= {"attn_out": Place(block.ln1_post, "out"), "mlp_out": Place(block.ln2_post, "out")}
    moe = block.mlp if isinstance(block.mlp, MixtureOfExperts) else None
    if moe is not None:
        if kind in ("mlp_pre", "mlp_hidden"):
            raise UserError(f"{name}: block {i}'s MLP is a mixture of {len(moe.experts)} experts, each with hidden "
                            "units of its own: ask for router_logits or expert_choices, or read an expert's neurons "
                            "(lumen.inspect.neurons, expert=...)")
        simple |= {"router_logits": Place(moe.router_logits, "out"), "expert_choices": Place(moe.choices, "out")}
    elif kind in names.ROUTER:
        raise UserError(f"{name}: block {i}'s MLP is not a mixture of experts, so it has no router")
    if kind in simple:
        return simple[kind]
    if kind == "mlp_hidden":
        return Place(block.mlp.down, "pre")
    if kind in SCALES:
        return Place(getattr(block, SCALES[kind]), "scale")
    if kind == "mlp_pre":   # the first matrix the MLP applies: W1, or the gate of a gated MLP
        return Place(getattr(block.mlp, "w_gate", None) or block.mlp.fc, "out")
    # resid_mid: pre-LN reads it through ln2; post-LN's ln1 produces it; a parallel block has none
    if isinstance(block, ParallelBlock):
        raise UserError(f"{name}: block {i} is a parallel block (attention and MLP read the same stream), "
                        "so there is no stream between them; use resid_pre or resid_post")
    return Place(block.ln1, "out") if isinstance(block, PostLNBlock) else Place(block.ln2, "readonly")


def _resolve(model: GPT, hooks: Hooks, every: list[str]) -> dict[str, list[Hook]]:
    """name -> its hook functions, in the order given."""
    found: dict[str, list[Hook]] = {}
    for pick, fn in hooks:
        if isinstance(pick, str):
            place(model, pick)   # a clear error for an unknown name, before anything runs
            matched = [pick]
        elif callable(pick):
            matched = [n for n in every if pick(n)]
        else:
            raise UserError(f"a hook's site must be a name or a predicate on names, got {pick!r}")
        for n in matched:
            found.setdefault(n, []).append(fn)
    return found


def _apply(name: str, a: torch.Tensor, fns: list[Hook], back: list[Hook], heads: int | None) -> torch.Tensor | None:
    """Run the forward hooks on activation a (viewed per head if `heads`), attach the backward ones;
    the tensor to use instead of a, or None to use a itself."""
    shown = a.unflatten(-1, (heads, -1)) if heads else a
    x = shown
    for fn in fns:
        new = fn(x, name)
        if new is not None:
            if not isinstance(new, torch.Tensor) or new.shape != x.shape:
                got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise UserError(f"a hook on {name} returned {got}; it must return None or a tensor of the "
                                f"activation's shape {tuple(x.shape)}")
            x = new.to(x.dtype)
    if back and x.requires_grad:
        x.register_hook(_backward(name, back))
    if x is shown and not back:
        return None
    return x.flatten(-2) if heads else x


def _backward(name: str, back: list[Hook]) -> Callable[[torch.Tensor], torch.Tensor]:
    def hook(g: torch.Tensor) -> torch.Tensor:
        for fn in back:
            new = fn(g, name)
            if new is not None:
                g = new
        return g
    return hook


def _register(where: Place, name: str, fns: list[Hook], back: list[Hook]) -> torch.utils.hooks.RemovableHandle:
    module, heads = where.module, where.heads
    if where.where == "out":
        return module.register_forward_hook(lambda m, args, out: _apply(name, out, fns, back, heads))
    if where.where == "scale":
        def scale(m: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
            s = norm_scale(m, args[0])
            new = _apply(name, s, fns, back, None)
            return None if new is None else normalise(m, args[0], new)   # the norm again, with that scale
        return module.register_forward_hook(scale)
    if where.where == "readonly" and back:
        raise UserError(f"{name}: the gradient at a pre-LN block's resid_mid is its attn_out's (the MLP and the "
                        "stream both read it); hook the attn_out instead")

    def pre(m: nn.Module, args: tuple) -> tuple | None:
        new = _apply(name, args[0], fns, back, heads)
        if new is None:
            return None
        if where.where == "readonly":
            raise UserError(f"{name} of a pre-LN block cannot be replaced in place "
                            "(replace the block's attn_out or resid_pre instead)")
        return (new, *args[1:])
    return module.register_forward_pre_hook(pre)


def _pattern_layers(wanted: Iterable[str]) -> list[int]:
    """The blocks whose attention must take the plain path: those whose scores or pattern are hooked."""
    return [p.layer for p in map(names.parse, wanted)
            if p.kind in ("attn_pattern", "attn_scores") and p.layer is not None]


@contextmanager
def hooked(model: GPT, fwd_hooks: Hooks = (), bwd_hooks: Hooks = ()) -> Iterator[GPT]:
    """The model with the hooks registered while inside (see the module docstring); all removed on exit.
    The blocks whose scores or pattern are hooked run their attention through the plain softmax path."""
    every = activation_names(model, every=True)
    fwd, bwd = _resolve(model, fwd_hooks, every), _resolve(model, bwd_hooks, every)
    handles = []
    try:
        for name in dict.fromkeys([*fwd, *bwd]):
            handles.append(_register(place(model, name), name, fwd.get(name, []), bwd.get(name, [])))
        with plain_attention(model, _pattern_layers([*fwd, *bwd])):
            yield model
    finally:
        for h in handles:
            h.remove()


def inputs(model: GPT, idx: torch.Tensor | Sequence[int] | Batch, mask: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token ids (B, T), padding mask or None) on the model's device, from ids (T,) or (B, T) and a mask or a Batch."""
    if isinstance(idx, Batch):
        mask, idx = idx.mask, idx.ids
    idx = torch.as_tensor(idx, dtype=torch.long, device=model.device)
    if idx.dim() == 1:
        idx = idx[None]
    if mask is not None:
        mask = torch.as_tensor(mask, device=model.device).reshape(idx.shape).bool()
    return idx, mask


def run_with_hooks(model: GPT, idx: torch.Tensor | Sequence[int] | Batch, fwd_hooks: Hooks = (),
                   bwd_hooks: Hooks = (), mask: torch.Tensor | None = None) -> torch.Tensor:
    """The logits (B, T, V) of one forward pass with hooks (see the module docstring): fwd_hooks and
    bwd_hooks are [(name or predicate, fn(activation, name))]. The backward hooks fire when something
    computed from the logits is differentiated (``metric(logits).backward()``), after this call returns.
    idx: token ids (B, T) (with mask for a padded batch), or a `lumen.tokenizers.Batch`."""
    idx, mask = inputs(model, idx, mask)
    with hooked(model, fwd_hooks, bwd_hooks):
        logits, _ = model(idx, mask=mask)
    return logits


def hooks(model: GPT, fns: dict[str, Callable[[torch.Tensor], torch.Tensor | None]]):
    """`hooked` with one function of the activation alone per name: {name: fn(activation)}.

        >>> model, idx = GPT.from_preset("baby-gpt", n_layers=2), torch.tensor([[1, 2, 3]])
        >>> with hooks(model, {"blocks.0.mlp_out": lambda a: torch.zeros_like(a)}):
        ...     logits, _ = model(idx)
    """
    return hooked(model, [(name, _one_argument(fn)) for name, fn in fns.items()])


def _one_argument(fn: Callable[[torch.Tensor], torch.Tensor | None]) -> Hook:
    return lambda a, name: fn(a)
