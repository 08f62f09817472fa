"""Direct logit attribution: split a logit into the writes that made it.

The stream the unembedding reads is a sum of writes (the chapter's residual picture):

    x_final = embed + sum over blocks i of (attn_out_i + mlp_out_i)

The final norm is not linear, but once its scale s is frozen at the value the real forward pass used at
that position, it is: LayerNorm(x) = (x - mean(x)) / s * g + b, RMSNorm(x) = x / s * g. So the logit of
token t (the row u = W_U[t] of the unembedding, or u = W_U[a] - W_U[b] for a difference of two logits) is

    logit = sum over writes c of  c . w   +   b . u,      w = centre(g * u) / s   (RMSNorm: g * u / s)

and each write's share c . w is its direct contribution. A block's attention output splits further, head
by head, through attn.out's columns for that head (plus attn.out's bias):
attn_out = sum over h of W_O[:, h] z_h + b_O, so head h contributes z_h . (W_O[:, h]^T w).

    >>> a = attribute(model, ids, contrast=(tok.encode(" Paris")[0], tok.encode(" Rome")[0]))  # doctest: +SKIP
    >>> a.values[:, -1].sum(), a.logit[-1]              # equal to ~1e-6              # doctest: +SKIP

A soft-capped model (Gemma 2) squashes its logits last, cap * tanh(logit / cap), which is not linear: no
split of the capped logit into shares is exact. What is split is the logit before the cap, which the writes
do add up to (and which the cap maps one to one onto the model's logit); `Attribution.logit` is that one.

"Direct" means what a write adds through the stream straight to the read-out, not what it changes by
feeding later blocks (activation patching, lumen.inspect.patching, measures that).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import overload

import torch

from .. import names
from ..block import BranchOutputNormBlock
from ..errors import UserError
from ..model import GPT
from ..tokenizers import Batch
from ..tokenizers import single_token as _single_token
from ..tokenizers.shown import token_texts
from .cache import run_with_cache
from .hooks import inputs
from .readout import Readout
from .stack import check_sum, check_sum_of_writes, normed_write, out_norm_factor

__all__ = ["Attribution", "attribute", "top_components"]


def __getattr__(name: str):
    """single_token's old home, kept for one release: it is lumen.tokenizers.single_token (or tok.single_token)."""
    if name == "single_token":
        warnings.warn("lumen.inspect.attribution.single_token is deprecated: import it from lumen.tokenizers, or "
                      "call tok.single_token(text)", DeprecationWarning, stacklevel=2)
        return _single_token
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class Attribution:
    """Direct contributions to a logit (or a logit difference) at every position of one prompt.

    components[c] names row c of values: "embed" (or "tok_emb" and "pos_emb"), "blocks.i.attn",
    "blocks.i.mlp" for every block, then "ln_f.b" (the final LayerNorm's bias; RMSNorm has none) and "lm_head.b"
    (the unembedding's bias, where it has one: Phi-2, GPT-J).
    values[:, t].sum() == logit[t]; heads[i, :, t].sum() + attn_bias[i, t] == the row "blocks.i.attn".
    For a soft-capped model logit is the logit before the cap (the module docstring says why).
    """

    ids: list[int]
    tokens: list[str]
    target: list[int]                  # (T,) the token whose logit is split, per position
    minus: list[int] | None            # (T,) with a contrast: the token whose logit is subtracted
    components: list[str]
    values: torch.Tensor               # (C, T) float64
    heads: torch.Tensor                # (L, H, T) float64: each head's direct contribution
    attn_bias: torch.Tensor            # (L, T) float64: attn.out's bias
    logit: torch.Tensor                # (T,) the model's own logit (difference), from its forward pass

    def row(self, name: str) -> torch.Tensor:
        """The contributions (T,) of one named component."""
        if name not in self.components:
            raise UserError(f"no component {name!r}; components are {', '.join(self.components)}")
        return self.values[self.components.index(name)]

    def to_dict(self, name_of: Callable[[int], str] = str) -> dict:
        """Plain numbers for JSON; name_of(token id) names the targets (e.g. the tokenizer's decode)."""
        name = name_of
        return {
            "tokens": self.tokens, "ids": self.ids,
            "target": [name(i) for i in self.target],
            "minus": [name(i) for i in self.minus] if self.minus is not None else None,
            "logit": [round(float(x), 6) for x in self.logit],
            "components": {c: [round(float(x), 6) for x in v] for c, v in zip(self.components, self.values)},
            "heads": [[[round(float(x), 6) for x in h] for h in layer] for layer in self.heads],
            "attn_bias": [[round(float(x), 6) for x in b] for b in self.attn_bias],
        }


Targets = int | Sequence[int] | Sequence[Sequence[int]] | None
Pair = tuple[int | Sequence[int], int | Sequence[int]]


@overload
def attribute(model: GPT, idx: Batch, target: Targets = None, contrast: Pair | None = None,
              tokenizer=None) -> list[Attribution]: ...
@overload
def attribute(model: GPT, idx: torch.Tensor | Sequence[int], target: Targets = None,
              contrast: Pair | None = None, tokenizer=None) -> Attribution: ...
@torch.no_grad()
def attribute(
    model: GPT,
    idx: torch.Tensor | Sequence[int] | Batch,
    target: Targets = None,
    contrast: Pair | None = None,
    tokenizer=None,
) -> Attribution | list[Attribution]:
    """Direct logit attribution at every position of one prompt (ids (T,) or (1, T)), or of every prompt of
    a padded `Batch` (a list, one Attribution per prompt, each what that prompt gets alone).

    target: a token id (the same at every position), one per position (one prompt), or one per prompt (a
    batch); default the model's own top-1 prediction at each position. contrast=(a, b) splits
    logit[a] - logit[b] instead; for a batch a and b may be one id per prompt.
    """
    batched = isinstance(idx, Batch)
    ids, mask = inputs(model, idx)
    if ids.dim() != 2 or ids.size(1) == 0 or (not batched and ids.size(0) != 1):
        raise UserError(f"attribute reads one non-empty prompt (ids of shape (T,) or (1, T)) or a Batch, got "
                        f"{tuple(ids.shape)}")
    check_sum_of_writes(model)
    B, T = ids.shape
    L = len(model.blocks)
    last = names.activation(L - 1, "resid_post")
    kinds = ("z", "attn_out", "mlp_out")
    wanted = [names.EMBED, last] + [names.activation(i, k) for i in range(L) for k in kinds]
    # OLMo-2's attention writes ln1(attn): with ln1's scale frozen, linear in the heads again
    normed = [i for i, b in enumerate(model.blocks) if isinstance(b, BranchOutputNormBlock)]
    wanted += [names.activation(i, "ln1_scale") for i in normed]
    logits, cache = run_with_cache(model, ids, wanted, mask=mask)
    readout = Readout(model)
    if readout.cap is not None:  # split what the writes add up to: the logits before the cap (same top-1)
        logits = readout.linear(cache[last])
    logits = logits.double()                                                     # (B, T, V)
    tgt, minus = _targets(logits, target, contrast, batched)                     # (B, T) each
    W_U = readout.W_U
    u = W_U[tgt].double() - (W_U[minus].double() if minus is not None else 0)   # (B, T, d)
    logit = logits.gather(-1, tgt[..., None])[..., 0]
    if minus is not None:
        logit = logit - logits.gather(-1, minus[..., None])[..., 0]
    x_final = cache[last]
    w = readout.reading(u, readout.scale(x_final.double()))                      # (B, T, d)

    writes, rows = [], []
    embed = cache[names.EMBED]
    if model.pos_emb is not None:   # the token and the position write separately
        tok = model.tok_emb(ids)
        writes += [tok, embed - tok]
        rows += ["tok_emb", "pos_emb"]
    else:
        writes.append(embed)
        rows.append(names.EMBED)
    H = model.attention(0).n_heads
    heads = torch.zeros(L, H, B, T, dtype=torch.float64)
    attn_bias = torch.zeros(L, B, T, dtype=torch.float64)
    for i in range(L):
        writes += [cache[names.activation(i, "attn_out")], cache[names.activation(i, "mlp_out")]]
        rows += [names.write(i, "attn"), names.write(i, "mlp")]
        out, z = model.attention(i).out, cache[names.activation(i, "z")]
        # what a unit of attn.out's output is worth: w, or through a branch-output norm (OLMo-2) or a sandwich's
        # post-attention norm (Gemma 2/3), with its scale frozen, w * gain / scale
        wi = normed_write(model, i, cache)(w) * out_norm_factor(model, i, z)
        v = (wi @ out.weight.double()).unflatten(-1, (H, -1))                      # (B, T, H, hd): W_O^T w
        heads[i] = (z.double() * v).sum(-1).permute(2, 0, 1).cpu()
        if out.bias is not None:
            attn_bias[i] = (wi @ out.bias.double()).cpu()
    check_sum(x_final, sum(writes), mask)
    shares = [(c.double() * w).sum(-1) for c in writes]
    bias_share = readout.bias_share(u)
    if bias_share is not None:
        shares.append(bias_share)
        rows.append("ln_f.b")
    head_bias = model.lm_head.bias
    if head_bias is not None:  # the unembedding's own bias (Phi-2, GPT-J): the same share whatever the stream holds
        b_U = head_bias.double()
        shares.append(b_U[tgt] - (b_U[minus] if minus is not None else 0))
        rows.append("lm_head.b")
    values = torch.stack(shares).cpu()                                          # (C, B, T)
    real = mask.cpu() if mask is not None else torch.ones(B, T, dtype=torch.bool)
    found = []
    for b in range(B):
        cols = real[b]
        row_ids = ids[b][cols.to(ids.device)].tolist()
        tokens = token_texts(tokenizer, row_ids)
        found.append(Attribution(row_ids, tokens, tgt[b][cols].tolist(),
                                 minus[b][cols].tolist() if minus is not None else None, rows,
                                 values[:, b][:, cols], heads[:, :, b][..., cols], attn_bias[:, b][:, cols],
                                 logit[b].cpu()[cols]))
    return found if batched else found[0]


def _targets(logits: torch.Tensor, target: Targets, contrast: Pair | None, batched: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the token whose logit is split, the one subtracted or None), each (B, T), from attribute's arguments."""
    B, T, _ = logits.shape

    def grid(t: int | Sequence[int] | Sequence[Sequence[int]], what: str) -> torch.Tensor:
        g = torch.as_tensor(t, dtype=torch.long)
        if g.dim() == 0:
            return g.expand(B, T)
        if g.dim() == 1 and batched:
            if len(g) != B:
                raise UserError(f"{len(g)} {what}s for a batch of {B} prompts: give one, or one per prompt")
            return g[:, None].expand(B, T)
        if g.dim() == 1:
            if len(g) != T:
                raise UserError(f"{len(g)} {what}s for a prompt of {T} tokens: give one, or one per position")
            return g[None]
        raise UserError(f"{what} must be a token id or a list of them, got shape {tuple(g.shape)}")

    if contrast is not None:
        a, b = contrast
        return grid(a, "answer").to(logits.device), grid(b, "contrast token").to(logits.device)
    if target is None:
        return logits.argmax(-1), None
    return grid(target, "target").to(logits.device), None


def top_components(a: Attribution, position: int = -1, n: int = 10) -> list[tuple[str, float]]:
    """The n components with the largest |contribution| at a position, heads included (as "blocks.i.head.h"),
    each block's attention then counted through its heads and bias rather than as a whole."""
    t = position % len(a.ids)
    items = [(c, float(v[t])) for c, v in zip(a.components, a.values) if not c.endswith(".attn")]
    L, H = a.heads.shape[:2]
    items += [(names.head(i, h), float(a.heads[i, h, t])) for i in range(L) for h in range(H)]
    items += [(names.write(i, "attn") + ".bias", float(a.attn_bias[i, t])) for i in range(L) if a.attn_bias[i, t] != 0]
    return sorted(items, key=lambda kv: -abs(kv[1]))[:n]
