"""Generation: feed the model its own predictions, one token at a time, through the KV cache.

    >>> model = GPT.from_preset("baby-gpt", n_layers=2, context=16)
    >>> idx = torch.tensor([[1, 2, 3]])
    >>> generate(model, idx, 20, temperature=0).shape        # greedy; past the 16-token context the window slides
    torch.Size([1, 23])
    >>> next(tokens(model, idx, 5, Sampling(temperature=0.8, top_p=0.95))).shape   # one new id per row
    torch.Size([1])

How the next token is chosen is a `Sampling`: lumen's defaults, the model's own (`model.sampling`, read by
lumen.formats from a Hugging Face directory's generation_config.json), or the caller's, in that order of
precedence from last to first. This is the readable path; `lumen.fast` runs the same loop faster (compiled
steps, packed weights, a tuned thread count) for `lumen generate` and for Python callers who ask for it.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .attention import KVCache
from .errors import UserError
from .model import GPT, check_tokens

# the smallest positive temperature accepted: sampling closer to 0 is greedy decoding but for exact ties, so a
# smaller one (1e-45) is taken for a slip; 0 says greedy plainly
MIN_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class Sampling:
    """How each next token is chosen: greedy at temperature 0, else drawn from the softmax of the logits
    divided by the temperature, restricted to the top_k most likely tokens and to the smallest set holding
    top_p of the probability (None: no restriction). Checked once, when made.

    The defaults are lumen's: the temperature its training samples use, with the unlikely tail cut off
    (greedy decoding makes small models loop)."""

    temperature: float = 0.8
    top_p: float | None = 0.95
    top_k: int | None = None

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not (isinstance(t, numbers.Real) and math.isfinite(t) and t >= 0):
            raise UserError(f"temperature must be a finite number >= 0 (0 is greedy), got {t}")
        if 0 < t < MIN_TEMPERATURE:
            raise UserError(f"temperature {t} is too small to sample with: give 0 for greedy decoding, "
                            f"or at least {MIN_TEMPERATURE}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
            raise UserError(f"top_k must be a whole number >= 1, got {k}")
        if p is not None and (isinstance(p, bool) or not (isinstance(p, numbers.Real) and 0 < p <= 1)):
            raise UserError(f"top_p must be in (0, 1] (1 keeps every token), got {p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def but(self, temperature: float | None = None, top_p: float | None = None, top_k: int | None = None) -> Sampling:
        """These settings with some changed; a change given as None leaves that setting as it is."""
        return Sampling(self.temperature if temperature is None else temperature,
                        self.top_p if top_p is None else top_p, self.top_k if top_k is None else top_k)

    def describe(self) -> str:
        """One line: how the tokens are chosen."""
        if self.greedy:
            return "greedy decoding"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_p is not None:
            parts.append(f"top-p {self.top_p:g}")
        if self.top_k is not None:
            parts.append(f"top-k {self.top_k}")
        return "sampling at " + ", ".join(parts)


GREEDY = Sampling(temperature=0.0, top_p=None)


def sampling_for(model: GPT, temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None) -> Sampling:
    """The model's sampling defaults (lumen's if its files carry none), with the caller's changes."""
    return (model.sampling or Sampling()).but(temperature, top_p, top_k)


def sample_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of logits (B, vocab), chosen as `sampling` says."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # distances below the best token, then scaled: never above 0, so no temperature overflows the softmax
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / sampling.temperature
    if sampling.top_k is not None:
        kth = torch.topk(logits, min(sampling.top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        mass_before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        drop = mass_before >= sampling.top_p  # a token stays if the mass ahead of it is below top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


Step = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


@torch.inference_mode()
def tokens(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    step: Step | None = None,
    cache_slots: int | None = None,
    mask: torch.Tensor | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the next token ids (B,) one step at a time, conditioned on idx (B, T).

    With the KV cache each step feeds one token. Past the model's context the window slides: once
    the cache is full, each step re-reads the last `context` tokens from scratch. Every one of them
    has moved one position down and the oldest has left the view, so no cached key still holds
    (with learned positions the embeddings change; with RoPE the deeper layers' keys do, since
    they were computed from tokens now out of view). Without the cache each step re-reads the
    whole (cropped) sequence.

    sampling: default `sampling_for(model)`. step: what runs a step, called like the model (default the
    model itself; lumen.fast passes a compiled one, which sees two shapes only: one token with the cache,
    and the full window). cache_slots: the cache's size (default the prompt plus the new tokens, at most
    the context). mask (B, T): prompts of different lengths, padded on the left (`Tokenizer.pad(texts,
    side="left")`), True at real tokens: each row continues as its prompt alone would."""
    sampling = sampling or sampling_for(model)
    check_tokens(idx, model.cfg, 0, mask)
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if mask is not None and bool((mask[:, 1:].int() < mask[:, :-1].int()).any()):
        raise UserError("batched generation needs the prompts padded on the left (Tokenizer.pad(texts, side='left')),"
                        " so that every row's next token comes at the same slot")
    context, step = model.cfg.context, step if step is not None else model
    cache, held = None, idx.size(1)
    if use_cache:
        slots = min(context, cache_slots or idx.size(1) + max_new_tokens)
        cache = KVCache(model.cfg, idx.size(0), slots, idx.device, model.dtype)
    logits, _ = model(idx, cache=cache, mask=mask, last_only=True)
    seq, real = idx, mask
    for i in range(max_new_tokens):
        nxt = sample_next(logits[:, -1], sampling, generator)
        yield nxt
        if i + 1 == max_new_tokens:
            break
        seq = torch.cat((seq, nxt[:, None]), dim=1)[:, -context:]
        if real is not None:  # a decoded token is real
            real = torch.cat((real.bool(), real.new_ones(real.size(0), 1, dtype=torch.bool)), dim=1)[:, -context:]
        if cache is not None and held < cache.slots:
            logits, _ = step(nxt[:, None], cache=cache)    # one more token: its keys join the cache
            held += 1
        else:  # re-read the window
            logits, _ = step(seq, mask=real) if seq.size(1) == context else model(seq, mask=real, last_only=True)


def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """idx (B, T) followed by max_new_tokens sampled tokens: (B, T + max_new_tokens), any number of them
    (past the context the window slides). temperature (0 is greedy), top_k, top_p: as in `Sampling`;
    what is not given comes from `sampling_for(model)`. A seeded torch.Generator repeats a sample.
    mask: a left-padded batch's real tokens (see `tokens`); each row keeps its padding in front."""
    sampling = sampling_for(model, temperature=temperature, top_k=top_k, top_p=top_p)
    new = list(tokens(model, idx, max_new_tokens, sampling, generator, use_cache, mask=mask))
    return torch.cat([idx] + [t[:, None] for t in new], dim=1)


def __getattr__(name: str) -> object:
    """The old name of `tokens`, for one release ("stream" is the residual stream)."""
    if name == "stream":
        warnings.warn("lumen.decode.stream is now lumen.decode.tokens", DeprecationWarning, stacklevel=2)
        return tokens
    raise AttributeError(f"module 'lumen.decode' has no attribute {name!r}")
