"""The residual stream as a stack: the writes that add up to it, or the stream itself after every layer,
each row read out through the final norm and the unembedding.

In pre-LN (and parallel) blocks nothing normalises the stream itself, so the stream the final norm reads
is the sum of its writes (the chapter's residual picture):

    x_final = embed + sum over blocks i of (attn_out_i + mlp_out_i),   attn_out_i = sum over heads + bias

`decompose` stacks those writes (the heads too, with heads=True); with the final norm's scale frozen at
the value the forward pass used at each position (`Readout.frozen`), their read-outs add up to the
model's own logits, less the norm's bias, which is counted once (a soft-capped model's logits before the cap:
the cap is not linear, so the writes add up to what it squashes). `accumulated` stacks the stream after
the embedding and after every block; each row is read with its own scale, as if the model ended there (and
capped, as the model's logits are): that is the logit lens, here for chosen tokens or a logit difference,
per layer and position.

    >>> model = GPT.from_preset("baby-llama", n_layers=2).eval()
    >>> idx = torch.tensor([[1, 2, 3, 4]])
    >>> s = decompose(model, idx)
    >>> s.names
    ['embed', 'blocks.0.attn', 'blocks.0.mlp', 'blocks.1.attn', 'blocks.1.mlp']
    >>> d = s.logit_diff(5, 9)                                           # (rows, B, T)
    >>> logits, _ = model(idx)
    >>> bool(torch.allclose(d.sum(0), (logits[..., 5] - logits[..., 9]).double(), atol=1e-5))
    True
    >>> accumulated(model, idx).logit_diff(5, 9).shape                   # the lens: (layers + 1, B, T)
    torch.Size([3, 1, 4])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .. import names
from ..block import BranchOutputNormBlock, PostLNBlock, SandwichBlock
from ..errors import UserError
from ..model import GPT
from ..tokenizers import Batch
from .cache import run_with_cache
from .hooks import inputs
from .readout import Readout, norm_scale

TOLERANCE = 1e-3   # the largest |stream - sum of its named writes|, relative to the stream's size

Tokens = int | Sequence[int] | torch.Tensor


@dataclass
class Stack:
    """Residual-stream vectors (C, B, T, d), one row per name, and the final norm's scale each is read with.

    shared: the rows are writes into one stream and share that stream's scale (B, T, 1), the forward
    pass's: their read-outs add up to the model's logits less the norm's bias (`bias`). Otherwise every
    row is a stream of its own, read with its own scale (C, B, T, 1) and the bias included: a lens."""

    names: list[str]
    values: torch.Tensor        # (C, B, T, d)
    scale: torch.Tensor         # (B, T, 1) shared, or (C, B, T, 1)
    readout: Readout
    shared: bool
    mask: torch.Tensor | None = None   # (B, T): a padded batch's real tokens

    def __len__(self) -> int:
        return len(self.names)

    def row(self, name: str) -> torch.Tensor:
        """The (B, T, d) vectors of one named row."""
        if name not in self.names:
            raise UserError(f"no row {name!r} in this stack; it holds {', '.join(self.names)}")
        return self.values[self.names.index(name)]

    def normed(self) -> torch.Tensor:
        """(C, B, T, d): each row through the final norm with its scale: frozen (no bias) for shared rows,
        the whole norm for a lens's rows."""
        x = self.readout.frozen(self.values, self.scale)
        bias = self.readout.bias
        return x if self.shared or bias is None else x + bias

    @torch.no_grad()
    def logits(self, tokens: Tokens) -> torch.Tensor:
        """(C, B, T, n): each row's share of the logits of the given tokens (float64)."""
        u = self.readout.directions(tokens).double()                             # (n, d)
        out = torch.einsum("cbtd,nd->cbtn", self.normed().double(), u)
        # a lens's row is a whole read-out: with the unembedding's bias, then the soft-cap if any (shared rows are
        # shares of the logits before both: the bias is bias_share's, and the cap is not linear)
        return out if self.shared else self.readout.capped(out + self.readout.token_bias(torch.as_tensor(tokens)
                                                                                          .reshape(-1)))

    @torch.no_grad()
    def logit_diff(self, a: Tokens, b: Tokens) -> torch.Tensor:
        """(C, B, T): each row's share of logit[a] - logit[b] (float64); a and b token ids, or one per
        prompt of the batch ((B,) each)."""
        normed = self.normed().double()
        if self.shared or self.readout.cap is None:
            out = (normed * self._direction(a, b)).sum(-1)
            return out if self.shared else out + self._token_bias(a, b)
        cap = self.readout.capped   # a lens's rows: each logit with its bias, capped, then subtracted
        b_a, b_b = self._token_bias(a, None), self._token_bias(b, None)
        return cap((normed * self._rows(a)).sum(-1) + b_a) - cap((normed * self._rows(b)).sum(-1) + b_b)

    @torch.no_grad()
    def bias_share(self, a: Tokens, b: Tokens | None = None) -> torch.Tensor | None:
        """(B, T) or (B, T, n): what the norm's bias adds to logit[a] (minus logit[b]) once; None without a bias."""
        if self.readout.bias is None and self.readout.b_U is None:
            return None
        bias = self.readout.bias.double() if self.readout.bias is not None else torch.zeros(self.values.size(-1))
        if b is None:   # (and the unembedding's own bias, Phi-2's and GPT-J's, once)
            share = self.readout.directions(a).double() @ bias                    # (n,)
            share = share + self.readout.token_bias(torch.as_tensor(a).reshape(-1))
            return share.expand(*self.values.shape[1:3], -1)
        return ((self._direction(a, b) * bias).sum(-1) + self._token_bias(a, b)).expand(*self.values.shape[1:3])

    def _token_bias(self, a: Tokens, b: Tokens | None) -> torch.Tensor | float:
        """b_U[a] - b_U[b] as (B, 1) for one pair per prompt (broadcasting over positions), else a scalar."""
        t = self.readout.token_bias(a, b)
        return t.double()[:, None] if isinstance(t, torch.Tensor) and t.dim() == 1 else t

    def _direction(self, a: Tokens, b: Tokens) -> torch.Tensor:
        """W_U[a] - W_U[b]: (d,) for one pair, (B, 1, d) for one pair per prompt."""
        return self._rows(a) - self._rows(b)

    def _rows(self, a: Tokens) -> torch.Tensor:
        """W_U[a]: (d,) for one token, (B, 1, d) for one per prompt."""
        W = self.readout.W_U
        u = W[torch.as_tensor(a, dtype=torch.long, device=W.device)].double()
        if u.dim() == 2:
            if u.size(0) != self.values.size(1):
                raise UserError(f"{u.size(0)} answer pairs for a batch of {self.values.size(1)} prompts: give one "
                                "pair, or one per prompt")
            u = u[:, None]
        return u


@torch.no_grad()
def decompose(model: GPT, idx: torch.Tensor | Sequence[int] | Batch, mask: torch.Tensor | None = None,
              heads: bool = False) -> Stack:
    """The writes into the final stream as a shared-scale Stack: "embed" (or "tok_emb" and "pos_emb" with
    learned positions), then per block "blocks.i.attn" and "blocks.i.mlp"; with heads=True each block's
    attention is split into its heads ("blocks.i.head.h", each head's output through its columns of
    attn.out) and attn.out's bias ("blocks.i.attn.bias", when it has one).
    Pre-LN and parallel blocks only (a post-LN block renormalises the stream: it is no sum of writes)."""
    idx, mask = inputs(model, idx, mask)
    check_sum_of_writes(model)
    L = len(model.blocks)
    last = names.activation(L - 1, "resid_post")
    kinds = ("z", "attn_out", "mlp_out", "ln1_scale") if heads else ("attn_out", "mlp_out")
    _, cache = run_with_cache(model, idx, [names.EMBED, last] + [names.activation(i, k) for i in range(L)
                                                                  for k in kinds], mask=mask)
    rows, values = [], []
    embed = cache[names.EMBED]
    if model.pos_emb is not None:   # the token and the position write separately
        tok = model.tok_emb(idx)
        rows += ["tok_emb", "pos_emb"]
        values += [tok, embed - tok]
    else:
        rows.append(names.EMBED)
        values.append(embed)
    for i in range(L):
        if heads:
            out = model.attention(i).out
            z = cache[names.activation(i, "z")]                                      # (B, T, H, hd)
            H = z.size(2)
            W_O = out.weight.unflatten(1, (H, -1))                                   # (d, H, hd)
            # through OLMo-2's branch-output norm, or a sandwich's post-attention norm (Gemma 2/3), each head's write
            # times gain / scale (the scale frozen)
            norm, factor = normed_write(model, i, cache), out_norm_factor(model, i, z)
            values += [norm(w) * factor for w in torch.einsum("bthk,dhk->hbtd", z, W_O)]
            rows += [names.head(i, h) for h in range(H)]
            if out.bias is not None:
                rows.append(names.write(i, "attn") + ".bias")
                values.append(norm(out.bias.expand_as(embed)) * factor)
        else:
            rows.append(names.write(i, "attn"))
            values.append(cache[names.activation(i, "attn_out")])
        rows.append(names.write(i, "mlp"))
        values.append(cache[names.activation(i, "mlp_out")])
    stack = torch.stack(values)
    x_final = cache[last]
    check_sum(x_final, stack.sum(0), mask)
    readout = Readout(model)
    return Stack(rows, stack, readout.scale(x_final), readout, shared=True, mask=mask)


@torch.no_grad()
def accumulated(model: GPT, idx: torch.Tensor | Sequence[int] | Batch, mask: torch.Tensor | None = None,
                mid: bool = False, lens=None) -> Stack:
    """The stream after the embedding and after every block (rows "embed", "block 0", ...: `names.stream`),
    each read as if the model ended there (its own scale): the logit lens. mid=True adds the stream
    between each block's attention and its MLP ("blocks.i.resid_mid"; not for parallel blocks). lens: a
    `lumen.inspect.Lens` (e.g. a TunedLens) whose translation is applied to each row first."""
    idx, mask = inputs(model, idx, mask)
    L = len(model.blocks)
    wanted = [names.EMBED]
    for i in range(L):
        wanted += ([names.activation(i, "resid_mid")] if mid else []) + [names.activation(i, "resid_post")]
    _, cache = run_with_cache(model, idx, wanted, mask=mask)
    rows = [names.stream(0)]
    for i in range(L):
        rows += ([names.activation(i, "resid_mid")] if mid else []) + [names.stream(i + 1)]
    values = [cache[n] for n in wanted]
    if lens is not None:
        if mid:
            raise UserError("a lens translates the stream after whole blocks: ask for mid=False with a lens")
        values = [lens.translate(h, layer) for layer, h in enumerate(values)]
    stack = torch.stack(values)
    readout = Readout(model)
    return Stack(rows, stack, readout.scale(stack), readout, shared=False, mask=mask)


def out_norm_factor(model: GPT, layer: int, z: torch.Tensor) -> torch.Tensor | float:
    """What block `layer` multiplies its attention's output by on the way into the stream: 1, or for a sandwich
    block (Gemma 2) its post-attention RMSNorm with the scale frozen at the forward pass's, gain / s (B, T, d).
    Frozen, that norm is linear, so the heads' writes (each head's output through W_O, times this) add up to
    attn_out. z: the block's per-head outputs (B, T, H, d_head)."""
    block = model.blocks[layer]
    if not isinstance(block, SandwichBlock):
        return 1.0
    attn = model.attention(layer)
    before = attn.out(z.flatten(-2).to(attn.out.weight.dtype))                   # attention's output, pre-norm
    gain: torch.Tensor = block.ln1_post.gain  # type: ignore[assignment]  # (a norm: RMSNorm or OffsetRMSNorm)
    return gain.to(before.dtype) / norm_scale(block.ln1_post, before)


def normed_write(model: GPT, i: int, cache) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a part of block i's attention output reaches the stream: as it is, or through a branch-output norm
    (OLMo-2) with its scale frozen at the forward pass's (cache holds blocks.i.ln1_scale): c -> c / s * g."""
    block = model.blocks[i]
    if not isinstance(block, BranchOutputNormBlock):
        return lambda c: c
    scale, gain = cache[names.activation(i, "ln1_scale")], block.ln1.gain
    return lambda c: c / scale * gain


def check_sum_of_writes(model: GPT) -> None:
    """A clear error for a model whose final stream is not a sum of writes (post-LN blocks)."""
    if any(isinstance(b, PostLNBlock) for b in model.blocks):
        raise UserError("splitting the stream into writes needs pre-LN blocks: post-LN renormalises the stream in "
                        "every block, so the final stream is not a sum of the blocks' writes")
    if model.training:
        raise UserError("splitting the stream into writes needs the model in eval mode (model.eval()): dropout "
                        "would change the writes")


def check_sum(x_final: torch.Tensor, total: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """The final stream must be the sum of the named writes (at the real tokens), or the read-outs would not add up
    (a model family whose blocks write something else into the stream needs its writes named here)."""
    diff = (total.double() - x_final.double()).abs()
    scale = x_final.abs()
    if mask is not None:
        diff, scale = diff[mask], scale[mask]
    err = float(diff.max()) if diff.numel() else 0.0
    if err > TOLERANCE * max(1.0, float(scale.max()) if scale.numel() else 1.0):
        raise UserError(f"this model's final stream is not embed + the blocks' attn_out and mlp_out (off by {err:.3g}):"
                        " it cannot be split into its writes")
