"""How good a dictionary is, on held-out text: how much of its site it explains, how sparse it is, how many of
its features are dead, and how much of the model's next-token loss survives when it replaces the site.

    fvu          the fraction of variance unexplained: sum |x - x_hat|^2 / sum |x - mean(x)|^2
    l0           active features per token, on average
    dead         the share of features that never fire on the text
    ce_recovered (loss with the site zeroed - loss spliced) / (loss with the site zeroed - the model's loss):
                 1 when the reconstruction is as good as the site itself, 0 when it is no better than nothing

    >>> quality(model, sae, windows).fvu                      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..inspect.cache import replace_activation
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


def _loss(logits: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
    """The summed next-token loss of windows (B, T): each position predicts the next id of its window."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), windows[:, 1:].flatten(), reduction="sum")


@torch.no_grad()
def quality(model: GPT, sae: SAE, windows: torch.Tensor, batch: int = 8) -> Quality:
    """The dictionary measured on token windows (N, T) (see the module docstring)."""
    site = sae.site_out if isinstance(sae, Transcoder) else sae.site
    err_sq = var_sum = l0 = err_norm = site_norm = 0.0
    losses = torch.zeros(3, dtype=torch.float64)
    fired = torch.zeros(sae.d_sae, dtype=torch.bool)
    first, total = None, torch.zeros(0)
    for start in progress(range(0, windows.size(0), batch), desc=f"measuring the dictionary on {site}", unit="batch"):
        x_ids = windows[start:start + batch].to(model.device)
        losses[0] += float(_loss(model(x_ids)[0], x_ids))
        with spliced(model, sae) as seen:
            losses[1] += float(_loss(model(x_ids)[0], x_ids))
        with replace_activation(model, site, lambda a: torch.zeros_like(a)):
            losses[2] += float(_loss(model(x_ids)[0], x_ids))
        f = seen[f"{sae.site}.{FEATURES}"].float()
        x_hat = seen[f"{site}.{RECONSTRUCTION}"].float()
        x = x_hat + seen[f"{site}.{ERROR}"].float()
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
    n = windows.numel()
    var_sum -= float(total.pow(2).sum()) / n   # sum |x - mean|^2 = sum |x - s|^2 - n |mean - s|^2
    predicted = windows[:, 1:].numel()
    loss, spliced_loss, zeroed = (losses / predicted).tolist()
    gap = zeroed - loss
    return Quality(fvu=err_sq / var_sum, l0=l0 / n, dead=1 - float(fired.float().mean()), loss=loss,
                   loss_spliced=spliced_loss, loss_zeroed=zeroed,
                   ce_recovered=(zeroed - spliced_loss) / gap if gap else float("nan"),
                   error_norm=err_norm / n, site_norm=site_norm / n, tokens=n)
