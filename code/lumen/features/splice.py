"""A dictionary spliced into the forward pass: its reconstruction takes the place of the site it reads, through
lumen's hooks, and its features become named sites of their own.

    site.features          the feature activations (B, T, d_sae)
    site.reconstruction    what the dictionary rebuilds (B, T, d)
    site.error             what it misses: the site's activation minus the reconstruction

With `error=True` the error is added back, so the forward pass is exactly the model's own while every feature
is still there to read, patch or attribute to (the "error term" of circuit work).

    >>> with spliced(model, sae) as seen:                 # doctest: +SKIP
    ...     logits, _ = model(idx)                        # the model running on the dictionary's reconstruction
    >>> seen["blocks.8.resid_post.features"].shape        # doctest: +SKIP
    torch.Size([1, 12, 4608])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch

from .. import names
from ..errors import UserError
from ..inspect.cache import ActivationCache
from ..inspect.cache import run_with_cache as cached
from ..inspect.hooks import Hook, hooked, place
from ..model import GPT
from ..tokenizers import Batch
from .dictionary import SAE, Transcoder

FEATURES, RECONSTRUCTION, ERROR = "features", "reconstruction", "error"
Edit = Callable[[torch.Tensor, str], "torch.Tensor | None"]   # fn(features, site) -> changed features or None


@contextmanager
def spliced(model: GPT, *saes: SAE, error: bool = False, edit: Edit | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """While inside, each dictionary's reconstruction replaces its site (a transcoder's replaces the site it
    writes); yields a dict that each forward pass fills with `SITE.features`, `SITE.reconstruction` and
    `SITE.error` (detached). error=True adds the error back (the model's own output, features exposed).
    edit(features, site) may return changed features (e.g. one feature set to 0) before they are decoded."""
    seen: dict[str, torch.Tensor] = {}
    hooks: list[tuple[str, Hook]] = []
    for sae in saes:
        check_fits(model, sae)
        if isinstance(sae, Transcoder):
            hooks += _transcoder_hooks(sae, seen, error, edit)
        else:
            hooks.append((sae.site, _replace(sae, sae.site, seen, error, edit)))
    with hooked(model, hooks):
        yield seen


def _replace(sae: SAE, site: str, seen: dict, error: bool, edit, source: dict | None = None) -> Hook:
    """The hook that puts the dictionary's output at `site`: from the site's own activation (an SAE) or from
    the activation a transcoder read earlier in the same pass (`source`)."""
    def hook(a: torch.Tensor, name: str) -> torch.Tensor:
        x = a if source is None else source.pop("x")
        f = sae.encode(x)
        out = sae.write(x, f)
        err = a - out   # what the dictionary misses, before any edit: an edit changes only the features
        changed = edit(f, sae.site) if edit is not None else None
        if changed is not None:
            f, out = changed, sae.write(x, changed)
        seen.update({f"{sae.site}.{FEATURES}": f.detach(), f"{site}.{RECONSTRUCTION}": out.detach(),
                     f"{site}.{ERROR}": err.detach()})
        return out + err.detach() if error else out
    return hook


def _transcoder_hooks(sae: Transcoder, seen: dict, error: bool, edit) -> list[tuple[str, Hook]]:
    """A transcoder reads its input site, then replaces its output site later in the same forward pass."""
    if (place_in := _order(sae.site)) >= (place_out := _order(sae.site_out)):
        raise UserError(f"a transcoder must read a site before the one it writes; {sae.site} comes at or after "
                        f"{sae.site_out} ({place_in} >= {place_out})")
    source: dict[str, torch.Tensor] = {}

    def read(a: torch.Tensor, name: str) -> None:
        source["x"] = a

    return [(sae.site, read), (sae.site_out, _replace(sae, sae.site_out, seen, error, edit, source))]


def _order(site: str) -> tuple[int, int]:
    """Where a site comes in the forward pass: (block, position of its kind among lumen.names.KINDS)."""
    layer, kind, _ = names.parse(site)
    return (layer if layer is not None else -1, names.KINDS.index(kind) if kind in names.KINDS else -1)


def check_fits(model: GPT, sae: SAE) -> None:
    """The dictionary reads (and writes) vectors of its site's width, or a clear error before any pass."""
    place(model, sae.site)  # an unknown site: the names closest to it
    widths = {"mlp_hidden": model.cfg.hidden, "mlp_pre": model.cfg.hidden}
    for site, width in ((sae.site, sae.d_in), (getattr(sae, "site_out", sae.site), sae.W_dec.shape[1])):
        want = widths.get(names.parse(site).kind, model.cfg.d_model)
        if width != want:
            raise UserError(f"the dictionary on {site} has width {width}, but this model's {site} is {want} wide: "
                            f"it belongs to another model")


def run_with_cache(model: GPT, idx: torch.Tensor | Batch, *saes: SAE, names: Iterable[str] | None = None,
                   error: bool = True, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ActivationCache]:
    """lumen.inspect.run_with_cache with dictionaries spliced in: the cache also holds each one's
    `SITE.features`, `SITE.reconstruction` and `SITE.error`. error=True (the default) keeps the model's own
    forward pass, so every other activation is the model's; error=False runs it on the reconstructions."""
    with spliced(model, *saes, error=error) as seen:
        logits, cache = cached(model, idx, names=names, mask=mask)
    cache.update(seen)
    return logits, cache
