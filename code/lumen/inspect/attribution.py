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

"Direct" means what a write adds through the stream straight to the read-out, not what it changes by
feeding later blocks (activation patching, lumen.inspect.patching, measures that).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .. import names
from ..block import LayerNorm, PostLNBlock, RMSNorm
from ..errors import UserError
from ..model import GPT
from .cache import run_with_cache

TOLERANCE = 1e-3   # the largest |stream - sum of its named writes|, relative to the stream's size


@dataclass
class Attribution:
    """Direct contributions to a logit (or a logit difference) at every position of one prompt.

    components[c] names row c of values: "embed" (or "tok_emb" and "pos_emb"), "blocks.i.attn",
    "blocks.i.mlp" for every block, then "ln_f.b" (the final LayerNorm's bias; RMSNorm has none).
    values[:, t].sum() == logit[t]; heads[i, :, t].sum() + attn_bias[i, t] == the row "blocks.i.attn".
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


def readout_vector(norm: torch.nn.Module, x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(w, bias share): the final norm with its scale frozen at x's, followed by the read-out u.
    x: the stream the norm read (T, d); u: (T, d) read-out directions. Any write c then adds c . w[t]
    to position t's logit, and the norm's own bias adds the returned (T,) share (None: RMSNorm has no bias)."""
    if not isinstance(norm, (LayerNorm, RMSNorm)):
        raise UserError(f"direct logit attribution needs a final LayerNorm or RMSNorm; this model's is "
                        f"{type(norm).__name__}")
    x = x.double()
    gu = norm.g.double() * u
    if isinstance(norm, LayerNorm):
        s = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)    # the scale the forward pass used
        w = (gu - gu.mean(-1, keepdim=True)) / s      # centring a write is the same as centring the read-out
        return w, (u * norm.b.double()).sum(-1)
    s = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)                 # RMSNorm
    return gu / s, None


def single_token(tokenizer, text: str, what: str) -> int:
    """The id of text if it is exactly one token of this tokenizer, else a clear error."""
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise UserError(f"{what} {text!r} is {len(ids)} tokens {pieces}, not one: give a single token "
                        "(often with its leading space, e.g. ' Paris')")
    return ids[0]


@torch.no_grad()
def attribute(
    model: GPT,
    idx: torch.Tensor | Sequence[int],
    target: int | Sequence[int] | None = None,
    contrast: tuple[int, int] | None = None,
    tokenizer=None,
) -> Attribution:
    """Direct logit attribution for one prompt (ids (T,) or (1, T)) at every position.

    target: a token id (the same at every position) or one per position; default the model's own top-1
    prediction at each position. contrast=(a, b) splits logit[a] - logit[b] instead.
    """
    idx = torch.as_tensor(idx, dtype=torch.long, device=model.device)
    if idx.dim() == 1:
        idx = idx[None]
    if idx.dim() != 2 or idx.size(0) != 1 or idx.size(1) == 0:
        raise UserError(f"attribute reads one non-empty prompt: ids of shape (T,) or (1, T), got {tuple(idx.shape)}")
    if any(isinstance(b, PostLNBlock) for b in model.blocks):
        raise UserError("direct logit attribution needs pre-LN blocks: post-LN renormalises the stream in every "
                        "block, so the final stream is not a sum of the blocks' writes")
    if model.training:
        raise UserError("attribute needs the model in eval mode (model.eval()): dropout would change the writes")
    L, T = len(model.blocks), idx.size(1)
    last = names.activation(L - 1, "resid_post")
    kinds = ("attn_heads", "attn_out", "mlp_out")
    wanted = [names.EMBED, last] + [names.activation(i, k) for i in range(L) for k in kinds]
    logits, cache = run_with_cache(model, idx, wanted)
    logits = logits[0].double()                                                 # (T, V)
    W_U = model.lm_head.weight                                                 # (V, d): row t reads token t
    if contrast is not None:
        a, b = contrast
        tgt, minus = [int(a)] * T, [int(b)] * T
        u = (W_U[a].double() - W_U[b].double()).expand(T, -1)
        logit = logits[:, a] - logits[:, b]
    else:
        if target is None:
            tgt = logits.argmax(-1).tolist()
        elif isinstance(target, int):
            tgt = [target] * T
        else:
            tgt = [int(t) for t in target]
            if len(tgt) != T:
                raise UserError(f"{len(tgt)} targets for a prompt of {T} tokens: give one, or one per position")
        minus = None
        u = W_U[tgt].double()
        logit = logits[torch.arange(T), tgt]
    x_final = cache[last][0]
    w, bias_share = readout_vector(model.ln_f, x_final, u)                     # (T, d), (T,)

    def share(c: torch.Tensor) -> torch.Tensor:
        return (c[0].double() * w).sum(-1)

    writes, rows = [], []
    embed = cache[names.EMBED]
    if model.pos_emb is not None:   # the token and the position write separately
        tok = model.tok_emb(idx)
        writes += [tok, embed - tok]
        rows += ["tok_emb", "pos_emb"]
    else:
        writes.append(embed)
        rows.append(names.EMBED)
    H = model.attention(0).n_heads
    heads = torch.zeros(L, H, T, dtype=torch.float64)
    attn_bias = torch.zeros(L, T, dtype=torch.float64)
    for i in range(L):
        writes += [cache[names.activation(i, "attn_out")], cache[names.activation(i, "mlp_out")]]
        rows += [names.write(i, "attn"), names.write(i, "mlp")]
        out = model.attention(i).out
        hd = out.in_features // H
        v = w @ out.weight.double()                                             # (T, H * hd): W_O^T w per position
        z = cache[names.activation(i, "attn_heads")][0].double()
        heads[i] = (z * v).view(T, H, hd).sum(-1).T.cpu()
        if out.bias is not None:
            attn_bias[i] = (w @ out.bias.double()).cpu()
    check_sum(x_final, writes)
    shares = [share(c) for c in writes]
    if bias_share is not None:
        shares.append(bias_share)
        rows.append("ln_f.b")
    values = torch.stack(shares).cpu()
    ids = idx[0].tolist()
    tokens = [tokenizer.decode([i]) for i in ids] if tokenizer is not None else [str(i) for i in ids]
    return Attribution(ids, tokens, tgt, minus, rows, values, heads, attn_bias, logit.cpu())


def check_sum(x_final: torch.Tensor, writes: list[torch.Tensor]) -> None:
    """The final stream must be the sum of the named writes, or the attribution would not add up (a model
    family whose blocks write something else into the stream needs its writes named here)."""
    total = sum(c[0].double() for c in writes)
    err = float((total - x_final.double()).abs().max())
    if err > TOLERANCE * max(1.0, float(x_final.abs().max())):
        raise UserError(f"this model's final stream is not embed + the blocks' attn_out and mlp_out (off by {err:.3g}):"
                        " direct logit attribution cannot split it")


def top_components(a: Attribution, position: int = -1, n: int = 10) -> list[tuple[str, float]]:
    """The n components with the largest |contribution| at a position, heads included (as "blocks.i.head.h"),
    each block's attention then counted through its heads and bias rather than as a whole."""
    t = position % len(a.ids)
    items = [(c, float(v[t])) for c, v in zip(a.components, a.values) if not c.endswith(".attn")]
    L, H = a.heads.shape[:2]
    items += [(names.head(i, h), float(a.heads[i, h, t])) for i in range(L) for h in range(H)]
    items += [(names.write(i, "attn") + ".bias", float(a.attn_bias[i, t])) for i in range(L) if a.attn_bias[i, t] != 0]
    return sorted(items, key=lambda kv: -abs(kv[1]))[:n]
