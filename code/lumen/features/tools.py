"""Every tool lumen has, on a dictionary's features instead of the model's own units.

- `feature_logits`: a feature's direct effect on the logits, its decoder row read the way the model reads
  the stream (through the final norm's gain and the unembedding): the logit lens of its direction.
- `top_contexts`: the contexts of a corpus where a feature fires hardest, with its activation on each token.
- `feature_attribution`: attribution patching on feature activations, one forward and one backward pass:
  (f_clean - f_corrupt) x d metric / d f at the corrupt run; `patch_feature` patches one feature exactly.

    >>> feature_logits(model, sae, 17).topk(5)                          # doctest: +SKIP
    >>> top_contexts(model, sae, tok, windows, feature=17)[:3]          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import names
from ..errors import UserError
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


@torch.no_grad()
def top_contexts(model: GPT, sae: SAE, tokenizer: Tokenizer, windows: torch.Tensor, feature: int, k: int = 10,
                 batch: int = 8) -> list[Context]:
    """The k contexts of token windows (N, T) where `feature` fires hardest (activation, text around the token)."""
    check_feature(sae, feature)
    layer = names.parse(sae.site).layer
    if layer is None:
        raise UserError(f"{sae.site} is not a site inside a block")
    values, positions = top_activations(model, windows, layer, k, batch, site=sae.site,
                                        read=lambda a: sae.encode(a)[..., feature:feature + 1])
    return contexts(tokenizer, windows, values[0], positions[0])


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
