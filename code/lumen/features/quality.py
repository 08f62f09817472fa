"""How good a dictionary is, on held-out text: how much of its site it explains, how sparse it is, how many of
its features are dead, and how much of the model's next-token loss survives when it replaces the site.

    fvu          the fraction of variance unexplained: sum |x - x_hat|^2 / sum |x - mean(x)|^2
    l0           active features per token, on average
    dead         the share of features that never fire on the text
    ce_recovered (loss with the site zeroed - loss spliced) / (loss with the site zeroed - the model's loss):
                 1 when the reconstruction is as good as the site itself, 0 when it is no better than nothing

With skip = n the first n positions of every window keep the model's own activation and are left out of every
measure (a model whose first position is an attention sink with a stream ~100x larger than the rest, as SmolLM2's:
a dictionary trained without it is measured without it).

    >>> quality(model, sae, windows).fvu                      # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..errors import UserError
from ..inspect.cache import replace_activation
from ..inspect.hooks import hooked
from ..model import GPT
from ..progress import progress
from .dictionary import SAE, Transcoder
from .splice import ERROR, FEATURES, RECONSTRUCTION, spliced


@dataclass
class Quality:
    fvu: float
    l0: float
    dead: float
    loss: float             # the model's own next-token loss on the text (nats per token)
    loss_spliced: float     # with the dictionary's output in place of its site
    loss_zeroed: float      # with the site zeroed
    ce_recovered: float
    error_norm: float       # mean |x - x_hat| per token, beside mean |x|
    site_norm: float
    tokens: int

    def to_dict(self) -> dict:
        return asdict(self)


def _loss(logits: torch.Tensor, windows: torch.Tensor, skip: int = 0) -> torch.Tensor:
    """The summed next-token loss of windows (B, T): each position from `skip` on predicts the next id."""
    return F.cross_entropy(logits[:, skip:-1].flatten(0, 1).float(), windows[:, skip + 1:].flatten(),
                           reduction="sum")


@contextmanager
def _spliced(model: GPT, sae: SAE, skip: int) -> Iterator[dict[str, torch.Tensor]]:
    """features.spliced, the first `skip` positions left as the model's own (the reconstruction in the model's
    dtype)."""
    if not skip:
        with spliced(model, sae) as found:
            yield found
        return
    if isinstance(sae, Transcoder):
        raise UserError("skip (leaving out the first positions) is for SAEs, not transcoders")
    seen: dict[str, torch.Tensor] = {}

    def hook(a: torch.Tensor, name: str) -> torch.Tensor:
        f = sae.encode(a)
        out = sae.write(a, f)
        seen.update({f"{sae.site}.{FEATURES}": f, f"{sae.site}.{RECONSTRUCTION}": out,
                     f"{sae.site}.{ERROR}": a - out})
        return torch.cat([a[:, :skip], out[:, skip:].to(a.dtype)], 1)

    with hooked(model, [(sae.site, hook)]):
        yield seen


@torch.no_grad()
def quality(model: GPT, sae: SAE, windows: torch.Tensor, batch: int = 8, skip: int = 0) -> Quality:
    """The dictionary measured on token windows (N, T) (see the module docstring)."""
    site = sae.site_out if isinstance(sae, Transcoder) else sae.site
    if not 0 <= skip < windows.size(1) - 1:
        raise UserError(f"skip ({skip}) must leave at least two positions of the windows ({windows.size(1)})")
    err_sq = var_sum = l0 = err_norm = site_norm = 0.0
    losses = torch.zeros(3, dtype=torch.float64)
    fired = torch.zeros(sae.d_sae, dtype=torch.bool)
    first, total = None, torch.zeros(0)
    for start in progress(range(0, windows.size(0), batch), desc=f"measuring the dictionary on {site}", unit="batch"):
        x_ids = windows[start:start + batch].to(model.device)
        losses[0] += float(_loss(model(x_ids)[0], x_ids, skip))
        with _spliced(model, sae, skip) as seen:
            losses[1] += float(_loss(model(x_ids)[0], x_ids, skip))
        with replace_activation(model, site, lambda a: torch.cat([a[:, :skip], torch.zeros_like(a[:, skip:])], 1)):
            losses[2] += float(_loss(model(x_ids)[0], x_ids, skip))
        f = seen[f"{sae.site}.{FEATURES}"][:, skip:].float()
        x_hat = seen[f"{site}.{RECONSTRUCTION}"][:, skip:].float()
        x = x_hat + seen[f"{site}.{ERROR}"][:, skip:].float()
        # the variance about the text's mean: accumulated as sums, with the first batch's mean as a shift
        first = x.mean((0, 1)) if first is None else first
        centred = (x - first).flatten(0, 1)
        total = centred.sum(0) if start == 0 else total + centred.sum(0)
        var_sum += float(centred.pow(2).sum())
        err_sq += float((x - x_hat).pow(2).sum())
        err_norm += float((x - x_hat).norm(dim=-1).sum())
        site_norm += float(x.norm(dim=-1).sum())
        l0 += float((f > 0).sum())
        fired |= (f > 0).flatten(0, 1).any(0).cpu()
    n = windows[:, skip:].numel()
    var_sum -= float(total.pow(2).sum()) / n   # sum |x - mean|^2 = sum |x - s|^2 - n |mean - s|^2
    predicted = windows[:, skip + 1:].numel()
    loss, spliced_loss, zeroed = (losses / predicted).tolist()
    gap = zeroed - loss
    return Quality(fvu=err_sq / var_sum, l0=l0 / n, dead=1 - float(fired.float().mean()), loss=loss,
                   loss_spliced=spliced_loss, loss_zeroed=zeroed,
                   ce_recovered=(zeroed - spliced_loss) / gap if gap else float("nan"),
                   error_norm=err_norm / n, site_norm=site_norm / n, tokens=n)
