"""The numbers of the explorer's feature pages (`lumen explore --sae`; drawn by lumen.report.explore.feature_page):
for each feature, its density, its top contexts with its activation on every token, the tokens its decoder row
promotes and suppresses, and its direction's logit-lens reading, as plain JSON-ready values.

    data = feature_data(model, tok, sae, windows, top=20)
    data["features"][0]["density"], data["features"][0]["lens"][:3]      # the densest feature's numbers
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import names
from ..inspect.neurons import shifted_tokens
from ..model import GPT
from .dictionary import SAE
from .tools import check_feature, depth, feature_contexts, feature_lens, feature_logits, scan, writes_stream


def feature_data(model: GPT, tokenizer, sae: SAE, windows: torch.Tensor, features: Sequence[int] | None = None,
                 top: int = 20, k: int = 10, n_tokens: int = 10, lens=None, corpus: str = "", skip: int = 1) -> dict:
    """The numbers of the feature pages: `features`, or the `top` densest ones that fire at all, over token windows
    (N, T); k contexts and n_tokens promoted, suppressed and lens tokens each; lens: a TunedLens (default the
    logit lens) for the reading of each direction. The first `skip` tokens of each window are read but never
    counted: the first is an attention sink, whose stream is far larger than any other's."""
    keep = torch.ones(windows.shape, dtype=torch.bool)
    keep[:, :skip] = False
    dens, values, positions = scan(model, sae, windows, k, mask=keep)
    if features is None:
        features = [int(i) for i in dens.topk(min(top, sae.d_sae)).indices if dens[i] > 0]
    pages = []
    for f in (check_feature(sae, f) for f in features):
        fired = values[f] > 0
        found = feature_contexts(model, sae, tokenizer, windows, f, values[f][fired], positions[f][fired])
        page: dict = {"feature": f, "density": float(dens[f]), "contexts": [
            {"activation": c.activation, "at": c.at, "tokens": c.tokens,
             "activations": c.activations} for c in found]}
        if writes_stream(sae):
            shifts = shifted_tokens(tokenizer, feature_logits(model, sae, f), n_tokens)
            probs = feature_lens(model, sae, f, lens=lens).float().softmax(-1).topk(n_tokens)
            page |= {"promoted": shifts["promoted"], "suppressed": shifts["suppressed"],
                     "lens": [(tokenizer.decode([int(i)]), float(p)) for p, i in zip(*probs)]}
        pages.append(page)
    return {"model": model.cfg.name, "site": sae.site, "d_sae": sae.d_sae, "activation": type(sae.act).__name__,
            "tokens": int(keep.sum()), "corpus": corpus, "lens": "logit lens" if lens is None else "tuned lens",
            "depth": names.stream(depth(sae)) if writes_stream(sae) else None, "features": pages}
