"""Where a forward pass first goes non-finite, for the one-line error a user gets instead of an internal one.

Weights can be finite and still ruin every forward pass: a damaged exponent (GGUF and safetensors data carry
no checksums) or a hand edit can leave values of 1e38, whose products overflow to infinity, and NaN follows
(inf - inf, 0 x inf). Loading cannot tell such weights from real ones without a threshold that would be a
guess, so nothing is checked on the way in or on the hot path: when a result turns out non-finite (a sampled
token's probabilities, a loss), the caller runs `diagnose` once, which repeats the forward pass with hooks on
every named activation (lumen.inspect.cache) and names the first one that went non-finite.

    >>> model = GPT.from_preset("baby-gpt", n_layers=2)
    >>> with torch.no_grad():
    ...     _ = model.blocks[1].mlp.fc.weight.fill_(1e38)
    >>> diagnose(model, torch.tensor([[1, 2, 3]])).site
    'blocks.1.mlp_hidden'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..errors import ModelFileError
from ..model import GPT
from .cache import activation_names, hooks

# what each per-block activation is, in words (blocks.i.<kind>)
SITES = {
    "resid_pre": "the stream entering block {i}", "attn_heads": "block {i}'s attention heads",
    "attn_out": "what block {i}'s attention writes", "resid_mid": "the stream between block {i}'s attention and MLP",
    "mlp_hidden": "block {i}'s MLP hidden units", "mlp_out": "what block {i}'s MLP writes",
    "resid_post": "the stream leaving block {i}",
}


@dataclass
class NonFinite:
    """The first activation of a forward pass that holds NaN or infinity."""

    site: str             # its name, e.g. "blocks.3.mlp_hidden"; "logits" for the unembedding's output
    kind: str             # "NaN" or "infinite values"
    largest_weight: float  # the largest |weight| of what computed it (the embeddings, the blocks up to it)
    weight: str           # which parameter holds that value

    def describe(self) -> str:
        m = re.fullmatch(r"blocks\.(\d+)\.(\w+)", self.site)
        where = SITES[m.group(2)].format(i=m.group(1)) if m else {
            "embed": "the embeddings", "final": "the final norm's output", "logits": "the logits"}[self.site]
        return f"{self.site} ({where})"


@torch.no_grad()
def diagnose(model: GPT, idx: torch.Tensor) -> NonFinite | None:
    """The first activation, in the order the forward pass computes them, that is not finite for token ids idx
    (B, T); None if every activation and the logits are finite. Costs one forward pass with hooks."""
    names = [n for n in activation_names(model) if not n.endswith("attn_pattern")]  # (the pattern: another path)
    found: list[tuple[str, str]] = []

    def watch(name: str):
        def fn(a: torch.Tensor) -> None:
            if not found and not bool(torch.isfinite(a).all()):
                found.append((name, "NaN" if bool(torch.isnan(a).any()) else "infinite values"))
        return fn

    with hooks(model, {n: watch(n) for n in names}):
        logits, _ = model(idx[:, -model.cfg.context:])
    if not found and not bool(torch.isfinite(logits).all()):
        found.append(("logits", "NaN" if bool(torch.isnan(logits).any()) else "infinite values"))
    if not found:
        return None
    site, kind = found[0]
    weight, largest = _largest_weight(model, site)
    return NonFinite(site, kind, largest, weight)


def _largest_weight(model: GPT, site: str) -> tuple[str, float]:
    """The parameter with the largest |value| among those that computed `site`: the embeddings and every block up
    to the site's (and the final norm and the unembedding, for the logits)."""
    m = re.fullmatch(r"blocks\.(\d+)\.\w+", site)
    last = int(m.group(1)) if m else len(model.blocks) if site in ("final", "logits") else -1

    def upstream(name: str) -> bool:
        if name.startswith("blocks."):
            return int(name.split(".")[1]) <= last
        return name.split(".")[0] in ("tok_emb", "pos_emb") or site in ("final", "logits")

    name, p = max(((n, p) for n, p in model.named_parameters() if upstream(n)),
                  key=lambda np_: float(np_[1].detach().float().abs().max()))
    return name, float(p.detach().float().abs().max())


def non_finite_error(model: GPT, idx: torch.Tensor | Iterable[torch.Tensor], source: str,
                     what: str = "the logits") -> ModelFileError:
    """The one-line error for a result (`what`) that came out non-finite: where the forward pass first went
    non-finite for token ids idx (or the first of several batches of them where it does) and the weight that
    is the likely cause, naming `source` (the model's file)."""
    found = None
    for batch in [idx] if isinstance(idx, torch.Tensor) else idx:
        if (found := diagnose(model, batch)) is not None:
            break
    if found is None:  # finite on a second look: the values were not the weights' (e.g. a sampling bug)
        return ModelFileError(f"{source}: {what} came out non-finite, though a second forward pass over the same "
                              "tokens is finite; please report it")
    return ModelFileError(
        f"{source}: {what} are not finite: the forward pass first holds {found.kind} at {found.describe()}; "
        f"the weights are the likely cause ({found.weight} holds values up to {found.largest_weight:.3g}): "
        "the file is damaged, download or convert it again")
