"""Every tool lumen has, on a dictionary's features instead of the model's own units.

- `feature_logits`: a feature's direct effect on the logits, its decoder row read the way the model reads
  the stream (through the final norm's gain and the unembedding).
- `feature_lens`: the logit lens of its direction: the decoder row read as a lens reads the stream after a
  chosen number of blocks (lumen.inspect.lens: translate, final norm, unembedding), as probabilities.
- `top_contexts`: the contexts of a corpus where a feature fires hardest, with its activation on each token;
  `scan`: every feature at once, with its density (the share of tokens it fires on).
- `feature_attribution`: attribution patching on feature activations, one forward and one backward pass:
  (f_clean - f_corrupt) x d metric / d f at the corrupt run; `patch_feature` patches one feature exactly.

    >>> feature_logits(model, sae, 17).topk(5)                          # doctest: +SKIP
    >>> top_contexts(model, sae, tok, windows, feature=17)[:3]          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .. import names
from ..errors import UserError
from ..inspect.cache import capture
from ..inspect.lens import Lens, LogitLens
from ..inspect.neurons import Context, contexts, direction_logits, top_activations
from ..model import GPT
from ..tokenizers import Tokenizer
from .dictionary import SAE, Transcoder
from .splice import FEATURES, spliced

Metric = Callable[[torch.Tensor], torch.Tensor]   # logits (B, T, V) -> a number to explain


def check_feature(sae: SAE, feature: int) -> int:
    if not 0 <= feature < sae.d_sae:
        raise UserError(f"feature {feature} is out of range: this dictionary has features 0..{sae.d_sae - 1}")
    return feature


def writes_stream(sae: SAE) -> bool:
    """Whether the dictionary's decoder writes vectors of the stream (so its rows can be read out)."""
    site = sae.site_out if isinstance(sae, Transcoder) else sae.site
    return names.parse(site).kind in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "mlp_in")


def feature_logits(model: GPT, sae: SAE, features: int | torch.Tensor | None = None) -> torch.Tensor:
    """How each feature's decoder row moves the logits, (V,) for one feature or (n, V): its direct logit
    effect, through the final norm's gain (the norm's division by the stream's size scales all logits alike
    and is left out). Only for a dictionary that writes a stream-sized site."""
    if not writes_stream(sae):
        raise UserError(f"a dictionary on {sae.site} does not write into the stream; its rows have no logits")
    rows = sae.W_dec.detach()
    if isinstance(features, int):
        return direction_logits(model, rows[check_feature(sae, features)][None])[0]
    return direction_logits(model, rows if features is None else rows[features])


def depth(sae: SAE) -> int:
    """How many blocks stand below the stream a dictionary writes into (a lens's row): block N's resid_pre is the
    stream after N blocks; anything else of block N is part of the stream after N + 1."""
    site = sae.site_out if isinstance(sae, Transcoder) else sae.site
    layer, kind, _ = names.parse(site)
    if layer is None:
        raise UserError(f"{site} is not a site inside a block")
    return layer if kind == "resid_pre" else layer + 1


@torch.no_grad()
def feature_lens(model: GPT, sae: SAE, feature: int, layer: int | None = None, lens: Lens | None = None
                 ) -> torch.Tensor:
    """The logit lens of a feature's direction, (V,) logits: its decoder row read as `lens` (default the logit
    lens) reads the stream after `layer` blocks (default: the stream the dictionary writes into). The final norm
    only rescales a single vector, so the logit lens ranks tokens as `feature_logits` does at every depth; its
    softmax is a reading in probabilities, and a tuned lens reads each depth its own way."""
    if not writes_stream(sae):
        raise UserError(f"a dictionary on {sae.site} does not write into the stream; its rows have no logits")
    lens = lens if lens is not None else LogitLens(model)
    layer = depth(sae) if layer is None else layer
    if not 0 <= layer <= lens.n_layers:
        raise UserError(f"layer {layer} is out of range: a lens reads the stream after 0..{lens.n_layers} blocks")
    row = sae.W_dec.detach()[check_feature(sae, feature)].to(model.lm_head.weight.dtype)
    return lens(row, layer)


@dataclass
class FeatureContext(Context):
    """A top context with the feature's activation on each of its tokens: tokens[at] is the trigger."""

    tokens: list[str] = field(default_factory=list)
    activations: list[float] = field(default_factory=list)
    at: int = 0


@torch.no_grad()
def activations(model: GPT, sae: SAE, windows: torch.Tensor, feature: int, batch: int = 8) -> torch.Tensor:
    """One feature's activation on every token of windows (N, T): (N, T)."""
    check_feature(sae, feature)
    found = [sae.encode(capture(model, windows[s:s + batch].to(model.device), sae.site))[..., feature].float().cpu()
             for s in range(0, windows.size(0), batch)]
    return torch.cat(found)


def feature_contexts(model: GPT, sae: SAE, tokenizer: Tokenizer, windows: torch.Tensor, feature: int,
                     values: torch.Tensor, positions: torch.Tensor, before: int = 12, after: int = 3
                     ) -> list[FeatureContext]:
    """The text around each of a feature's top activations (values, flat positions into windows.flatten(), from
    `scan` or `top_activations`), with the feature read again on every token shown."""
    T = windows.size(1)
    rows = sorted({p // T for p in positions.tolist()})
    acts = dict(zip(rows, activations(model, sae, windows[rows], feature))) if rows else {}
    found = []
    for c, p in zip(contexts(tokenizer, windows, values, positions, before, after), positions.tolist()):
        row, t = divmod(p, T)
        lo, hi = max(0, t - before), min(T, t + 1 + after)
        ids = windows[row, lo:hi].tolist()
        found.append(FeatureContext(c.activation, c.before, c.trigger, c.after, [tokenizer.decode([i]) for i in ids],
                                    acts[row][lo:hi].tolist(), t - lo))
    return found


@torch.no_grad()
def top_contexts(model: GPT, sae: SAE, tokenizer: Tokenizer, windows: torch.Tensor, feature: int, k: int = 10,
                 batch: int = 8) -> list[FeatureContext]:
    """The k contexts of token windows (N, T) where `feature` fires hardest: its activation there, the text
    around the token, and its activation on every token of that text."""
    check_feature(sae, feature)
    layer = names.parse(sae.site).layer
    if layer is None:
        raise UserError(f"{sae.site} is not a site inside a block")
    values, positions = top_activations(model, windows, layer, k, batch, site=sae.site,
                                        read=lambda a: sae.encode(a)[..., feature:feature + 1])
    return feature_contexts(model, sae, tokenizer, windows, feature, values[0], positions[0])


@torch.no_grad()
def scan(model: GPT, sae: SAE, windows: torch.Tensor, k: int = 10, batch: int = 8, mask: torch.Tensor | None = None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every feature over token windows (N, T) in one pass: its density, the share of the tokens it fires on
    (activation > 0), (d_sae,); and its k largest activations (d_sae, k) with their flat positions (d_sae, k).
    mask (N, T): the tokens that count (e.g. all but each window's first, an attention sink); the model still
    reads every token (it is not a padding mask)."""
    return scan_site(model, windows, sae.site, sae.encode, k, batch, mask)


@torch.no_grad()
def scan_site(model: GPT, windows: torch.Tensor, site: str, read: Callable[[torch.Tensor], torch.Tensor],
              k: int = 10, batch: int = 8, mask: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`scan` for any units read off a site of a block: read(activation) (B, T, units), e.g. a dictionary's
    encode, or the identity for an MLP's hidden units (site blocks.N.mlp_hidden)."""
    layer = names.parse(site).layer
    if layer is None:
        raise UserError(f"{site} is not a site inside a block")
    mask = torch.ones(windows.shape, dtype=torch.bool) if mask is None else mask.cpu()
    fired: torch.Tensor | None = None
    done = [0]   # windows read so far: which rows of the mask the next batch is

    def count(a: torch.Tensor) -> torch.Tensor:
        nonlocal fired
        u = read(a)
        m = mask[done[0]:done[0] + u.size(0)]
        done[0] += u.size(0)
        on = ((u > 0).cpu() & m[..., None]).flatten(0, 1).sum(0, dtype=torch.float64)   # counted as they go by
        fired = on if fired is None else fired + on
        return u.masked_fill(~m[..., None].to(u.device), float("-inf"))   # a token that does not count never wins

    values, positions = top_activations(model, windows, layer, k, batch, site=site, read=count)
    assert fired is not None
    return fired / mask.sum(), values, positions


def density(model: GPT, sae: SAE, windows: torch.Tensor, batch: int = 8, mask: torch.Tensor | None = None
            ) -> torch.Tensor:
    """The share of the tokens of windows (N, T) on which each feature fires (activation > 0): (d_sae,)."""
    return scan(model, sae, windows, 1, batch, mask)[0]


def feature_attribution(model: GPT, sae: SAE, clean: torch.Tensor, corrupt: torch.Tensor, metric: Metric
                        ) -> torch.Tensor:
    """Attribution patching on features (B, T, d_sae): the metric's first-order change when each feature's
    activation goes from its corrupt value to its clean one, (f_clean - f_corrupt) x d metric / d f,
    from one clean forward pass and one corrupt forward and backward pass. The error term is kept (exact
    forward passes), so what is attributed is the model itself."""
    key = f"{sae.site}.{FEATURES}"
    with torch.no_grad(), spliced(model, sae, error=True) as seen:
        model(clean)
        f_clean = seen[key]
    leaf: dict[str, torch.Tensor] = {}

    def differentiable(f: torch.Tensor, site: str) -> torch.Tensor:
        leaf["f"] = f.detach().requires_grad_(True)
        return leaf["f"]

    with spliced(model, sae, error=True, edit=differentiable):
        logits, _ = model(corrupt)
    metric(logits).backward()
    grad = leaf["f"].grad
    assert grad is not None
    return (f_clean - leaf["f"].detach()) * grad


@torch.no_grad()
def patch_feature(model: GPT, sae: SAE, idx: torch.Tensor, feature: int, value: float | torch.Tensor
                  ) -> torch.Tensor:
    """The logits (B, T, V) with one feature's activation set to value at every position (the error term kept,
    so only that feature changes)."""
    check_feature(sae, feature)

    def set_it(f: torch.Tensor, site: str) -> torch.Tensor:
        f = f.clone()
        f[..., feature] = torch.as_tensor(value, dtype=f.dtype, device=f.device)
        return f

    with spliced(model, sae, error=True, edit=set_it):
        return model(idx)[0]
