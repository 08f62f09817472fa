"""The logit lens (nostalgebraist 2020): read the residual stream after every layer through the model's
own final norm and unembedding, and watch the prediction form.

    >>> result = logit_lens(model, idx, tokenizer=tok)        # doctest: +SKIP
    >>> result.top_tokens(layer=6)[-1]                        # doctest: +SKIP
    ' Paris'

Row l of a result is the stream after l blocks, named as everywhere in lumen (`names.stream`): row 0
"embed" (the embedding), row l "block l-1"; the last row, the last block's output, is read exactly as the
model reads it. A padded `Batch` of prompts gives one result per prompt, each what the prompt gets alone.
The lens of chosen tokens, or of a logit difference, per layer and position and for a whole batch at once:
``lumen.inspect.stack.accumulated(model, batch).logit_diff(a, b)``, (layers + 1, B, T).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import overload

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import names
from ..errors import UserError
from ..model import GPT
from ..progress import progress
from ..tokenizers import Batch
from ..tokenizers.shown import token_texts
from .cache import run_with_cache
from .hooks import inputs
from .readout import Readout

MAX_CHUNK_BYTES = 256 * 2**20  # how many layers' logits to hold at once


class Lens(nn.Module):
    """Reads a next-token prediction out of the stream after layer l: unembed(translate(h, l))."""

    def __init__(self, model: GPT):
        super().__init__()
        self._model = (model,)  # a reference, not a submodule: a lens never saves or trains the model
        self.n_layers = len(model.blocks)

    @property
    def model(self) -> GPT:
        return self._model[0]

    def translate(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """Bring the stream after `layer` closer to the final one (the identity for the logit lens)."""
        return h

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """The model's own read-out: final norm, then the unembedding (`Readout`)."""
        return Readout(self.model)(h)

    def forward(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        return self.unembed(self.translate(h, layer))


class LogitLens(Lens):
    """The final norm and unembedding applied unchanged to every layer's stream."""


def streams(model: GPT, idx: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the model's logits (B, T, V), the stream after every layer (n_layers + 1, B, T, d)) in one forward
    (mask: a padded batch's real tokens)."""
    wanted = [names.EMBED] + [names.activation(i, "resid_post") for i in range(len(model.blocks))]
    logits, cache = run_with_cache(model, idx, wanted, mask=mask)
    return logits, cache.streams()


def _chunks(n_layers: int, rows: int, vocab: int) -> list[range]:
    per = max(1, MAX_CHUNK_BYTES // max(1, rows * vocab * 4))
    return [range(a, min(a + per, n_layers)) for a in range(0, n_layers, per)]


def lens_logits(lens: Lens, hs: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """Logits of several layers at once: translate each, then one batched unembedding. hs: (n, ..., d)."""
    return lens.unembed(torch.stack([lens.translate(h, layer) for h, layer in zip(hs, layers)]))


def kl_to_final(final_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(final || lens) in nats per position: what the lens misses of the model's own prediction."""
    return (final_logp.exp() * (final_logp - logp)).sum(-1)


@dataclass
class LensResult:
    """What a lens sees at every layer (rows 0..n_layers) and position of one prompt."""

    ids: list[int]
    tokens: list[str]              # the prompt's tokens as text
    top_ids: torch.Tensor          # (layers, T, k) the lens's k most likely next tokens
    top_probs: torch.Tensor        # (layers, T, k) and their probabilities
    next_prob: torch.Tensor        # (layers, T - 1) probability of the token that actually comes next
    next_rank: torch.Tensor        # (layers, T - 1) its rank (0 = top-1)
    entropy: torch.Tensor          # (layers, T) of the lens's distribution, nats
    kl: torch.Tensor               # (layers, T) KL(final || lens), nats; 0 at the last layer
    texts: dict[int, str] = field(default_factory=dict)  # token id -> text, when a tokenizer was given
    final_prob: torch.Tensor | None = None  # (layers, T) probability of the model's own final top-1 token

    @property
    def n_layers(self) -> int:
        return self.top_ids.size(0) - 1

    def top_tokens(self, layer: int) -> list[str]:
        """The top-1 token (as text) at every position, read after `layer` blocks."""
        return [self.vocab_of(int(t)) for t in self.top_ids[layer, :, 0]]

    def vocab_of(self, token_id: int) -> str:
        return self.texts.get(token_id, str(token_id))

    def first_top1_layer(self, position: int = -1) -> int:
        """The first layer whose top-1 token at `position` is the model's final top-1 (the last layer at the latest)."""
        final = self.top_ids[-1, position, 0]
        return int((self.top_ids[:, position, 0] == final).nonzero()[0])

    def to_dict(self) -> dict:
        """Plain numbers and strings for JSON."""
        k = self.top_ids.size(-1)
        return {
            "tokens": self.tokens,
            "ids": self.ids,
            "layers": [
                {
                    "after": names.stream(layer),
                    "kl": [round(float(x), 6) for x in self.kl[layer]],
                    "entropy": [round(float(x), 6) for x in self.entropy[layer]],
                    "next_prob": [round(float(x), 6) for x in self.next_prob[layer]],
                    "next_rank": [int(x) for x in self.next_rank[layer]],
                    "top": [
                        [[self.vocab_of(int(self.top_ids[layer, t, j])), round(float(self.top_probs[layer, t, j]), 6)]
                         for j in range(k)]
                        for t in range(len(self.ids))
                    ],
                }
                for layer in range(self.n_layers + 1)
            ],
        }


@overload
def logit_lens(model: GPT, idx: Batch, lens: Lens | None = None, k: int = 5, tokenizer=None) -> list[LensResult]: ...
@overload
def logit_lens(model: GPT, idx: torch.Tensor | Sequence[int], lens: Lens | None = None, k: int = 5,
               tokenizer=None) -> LensResult: ...
@torch.no_grad()
def logit_lens(
    model: GPT,
    idx: torch.Tensor | Sequence[int] | Batch,
    lens: Lens | None = None,
    k: int = 5,
    tokenizer=None,
) -> LensResult | list[LensResult]:
    """Run the model once on one prompt (ids (T,) or (1, T)) and read every layer through `lens`
    (default: the logit lens); or on a padded `Batch`, one result per prompt. The unembeddings of many
    layers are batched into one matmul."""
    batched = isinstance(idx, Batch)
    ids, mask = inputs(model, idx)
    if ids.dim() != 2 or (ids.size(0) != 1 and not batched):
        raise UserError(f"logit_lens reads one prompt (ids of shape (T,) or (1, T)) or a Batch, got {tuple(ids.shape)}")
    if ids.size(1) == 0:
        raise UserError("empty prompt: give at least one token")
    lens = lens if lens is not None else LogitLens(model)
    logits, hs = streams(model, ids, mask)
    found = []
    for b in range(ids.size(0)):
        cols = mask[b] if mask is not None else slice(None)
        found.append(_read(lens, hs[:, b, cols], logits[b, cols], ids[b, cols], k, tokenizer))
    return found if batched else found[0]


def _read(lens: Lens, hs: torch.Tensor, logits: torch.Tensor, idx: torch.Tensor, k: int, tokenizer) -> LensResult:
    """One prompt's lens: hs (layers, T, d) its streams, logits (T, V) the model's, idx (T,) its ids."""
    final_logp = F.log_softmax(logits.float(), -1)             # (T, V) the model's own output
    targets = idx[1:]
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in ("top_p", "top_i", "p_next", "rank", "ent", "kl", "final")}
    final_top1 = final_logp.argmax(-1)                         # (T,)
    T, V = final_logp.shape
    for chunk in _chunks(hs.size(0), T, V):
        z = lens_logits(lens, hs[chunk.start : chunk.stop], chunk).float()    # (n, T, V)
        logp = F.log_softmax(z, -1)
        del z
        top = logp.topk(min(k, V), dim=-1)
        parts["top_p"].append(top.values.exp())
        parts["top_i"].append(top.indices)
        lp_next = logp[:, :-1].gather(-1, targets[None, :, None].expand(len(chunk), -1, 1))  # (n, T-1, 1)
        parts["p_next"].append(lp_next[..., 0].exp())
        parts["rank"].append((logp[:, :-1] > lp_next).sum(-1))
        parts["ent"].append(-(logp.exp() * logp).sum(-1))
        parts["final"].append(logp.gather(-1, final_top1[None, :, None].expand(len(chunk), -1, 1))[..., 0].exp())
        # elementwise, then summed (not one long dot product): the last layer's KL is 0 to float precision
        parts["kl"].append(F.kl_div(logp, final_logp, reduction="none", log_target=True).sum(-1))
    cat = {n: torch.cat(v).cpu() for n, v in parts.items()}
    ids = idx.tolist()
    tokens = token_texts(tokenizer, ids)
    texts = {}
    if tokenizer is not None:
        seen = sorted(set(cat["top_i"].flatten().tolist()))
        texts = dict(zip(seen, token_texts(tokenizer, seen)))
    return LensResult(ids, tokens, cat["top_i"], cat["top_p"], cat["p_next"], cat["rank"], cat["ent"], cat["kl"],
                      texts, cat["final"])


@torch.no_grad()
def evaluate_lens(model: GPT, lens: Lens, batches: Iterable[torch.Tensor], desc: str = "evaluating the lens"
                  ) -> dict[str, list[float]]:
    """Per layer, over held-out token batches (B, T): the mean KL to the model's final output and the
    mean cross-entropy against the actual next tokens (and its perplexity)."""
    kl_sum: torch.Tensor | None = None
    ce_sum: torch.Tensor | None = None
    n_tokens = 0
    batches = list(batches)
    bar = progress(total=len(batches), desc=desc, unit="batch")   # updated by hand: inside a bar of batches, it
    for idx in batches:                                            # advances that one (lumen.progress)
        logits, hs = streams(model, idx)
        final_logp = F.log_softmax(logits[:, :-1].float(), -1)
        targets = idx[:, 1:]
        B, T1, V = final_logp.shape
        kl_l, ce_l = [], []
        for chunk in _chunks(hs.size(0), B * T1, V):
            logp = F.log_softmax(lens_logits(lens, hs[chunk.start : chunk.stop, :, :-1], chunk).float(), -1)
            kl_l.append(kl_to_final(final_logp, logp).sum((1, 2)))
            ce_l.append(-logp.gather(-1, targets[None, ..., None].expand(len(chunk), -1, -1, 1)).sum((1, 2, 3)))
        kl, ce = torch.cat(kl_l).double(), torch.cat(ce_l).double()
        kl_sum = kl if kl_sum is None else kl_sum + kl
        ce_sum = ce if ce_sum is None else ce_sum + ce
        n_tokens += B * T1
        bar.update()
    bar.close()
    if kl_sum is None or ce_sum is None or not n_tokens:
        raise UserError("no held-out tokens to evaluate the lens on (give a longer corpus)")
    mean_kl, mean_ce = (kl_sum / n_tokens).tolist(), (ce_sum / n_tokens).tolist()
    return {"kl": mean_kl, "cross_entropy": mean_ce, "perplexity": [float(torch.tensor(c).exp()) for c in mean_ce]}
