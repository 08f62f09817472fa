"""Activation patching: where does the information that decides a prediction live?

Run a clean prompt ("The Eiffel Tower is in the city of" -> " Paris") and a corrupted one of the same
length ("The Colosseum is in the city of" -> " Rome"). Then run the corrupted prompt again with one
activation copied in from the clean run, at one site: the stream entering block i, a block's attention
or MLP output, or one head's output, at one position (or all). How much of the clean answer comes back?

    restored = (metric(patched) - metric(corrupt)) / (metric(clean) - metric(corrupt))

0: that site carries none of what the clean prompt adds; 1: all of it. The metric is by default the
logit difference between the clean answer and the corrupt answer at the last position.

    >>> r = patching_maps(model, clean_ids, corrupt_ids)           # doctest: +SKIP
    >>> r.maps["resid_pre"].shape                      # (n_layers, T)   # doctest: +SKIP

Built on lumen.inspect.cache's named activations and its `hooks` context manager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import names
from ..errors import UserError
from ..model import GPT
from .cache import check_layer, hooks, run_with_cache

# a site kind -> the named activation it patches
KINDS = {"resid_pre": "resid_pre", "attn_out": "attn_out", "mlp_out": "mlp_out", "head": "attn_heads"}
MAX_BATCH_BYTES = 256 * 2**20   # roughly the activations of the patched copies run at once


@dataclass(frozen=True)
class Site:
    """One place to copy the clean activation into the corrupted run. position None: every position;
    head: which head (kind "head" only: its slice of the heads' outputs before attn.out)."""

    kind: str
    layer: int
    position: int | None = None
    head: int | None = None

    @property
    def name(self) -> str:
        return names.activation(self.layer, KINDS[self.kind])


Metric = Callable[[torch.Tensor], torch.Tensor]   # logits at the metric's position (B, V) -> (B,)


def logit_diff(answer: int, wrong: int) -> Metric:
    """logit[answer] - logit[wrong]: how much the model prefers the clean answer over the corrupt one."""
    return lambda z: z[:, answer] - z[:, wrong]


def logprob(answer: int) -> Metric:
    """log p(answer)."""
    return lambda z: F.log_softmax(z.float(), -1)[:, answer]


def _check(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, sites: Sequence[Site]) -> None:
    if clean.shape != corrupt.shape:
        raise UserError(f"the clean and the corrupted prompt must have the same number of tokens, got "
                        f"{clean.size(-1)} and {corrupt.size(-1)} (reword one so that they tokenize alike)")
    T, H = clean.size(-1), model.attention(0).n_heads
    for s in sites:
        if s.kind not in KINDS:
            raise UserError(f"unknown site kind {s.kind!r}; kinds are {', '.join(KINDS)}")
        check_layer(model, s.layer)
        if s.position is not None and not -T <= s.position < T:
            raise UserError(f"position {s.position} is outside the prompt's {T} tokens")
        if (s.kind == "head") != (s.head is not None) or (s.head is not None and not 0 <= s.head < H):
            raise UserError(f"site {s}: a head site needs a head in 0..{H - 1}, other kinds none")


def _as_ids(model: GPT, idx: torch.Tensor | Sequence[int]) -> torch.Tensor:
    idx = torch.as_tensor(idx, dtype=torch.long, device=model.device)
    return idx[None] if idx.dim() == 1 else idx


class _Read(Exception):
    """Stops the forward pass once the final stream exists (the full logits are never needed)."""


@torch.no_grad()
def run_patched(model: GPT, clean_cache: dict, corrupt: torch.Tensor, groups: Sequence[Sequence[Site]],
                position: int = -1) -> torch.Tensor:
    """Logits (len(groups), V) at `position` of the corrupted prompt (1, T), run once per group of sites
    (as one batch), each copy with its group's activations taken from clean_cache."""
    by_name: dict[str, list[tuple[int, Site]]] = {}
    for b, group in enumerate(groups):
        for s in group:
            by_name.setdefault(s.name, []).append((b, s))

    def patcher(name: str):
        clean = clean_cache[name][0]

        def fn(a: torch.Tensor) -> torch.Tensor:
            a = a.clone()
            for b, s in by_name[name]:
                t = slice(None) if s.position is None else s.position
                if s.head is None:
                    a[b, t] = clean[t]
                else:
                    hd = a.size(-1) // model.attention(s.layer).n_heads
                    cols = slice(s.head * hd, (s.head + 1) * hd)
                    a[b, t, cols] = clean[t, cols]
            return a
        return fn

    got: list[torch.Tensor] = []

    def read(a: torch.Tensor) -> None:
        got.append(a[:, position])
        raise _Read

    fns = {name: patcher(name) for name in by_name}
    fns["final"] = read
    with hooks(model, fns):
        try:
            model(corrupt.expand(len(groups), -1))
        except _Read:
            pass
    return model.lm_head(got[0])


@dataclass
class Patching:
    """What patching restored: clean and corrupt metric values and, per site kind, a map of fractions."""

    clean_tokens: list[str]
    corrupt_tokens: list[str]
    clean_metric: float
    corrupt_metric: float
    maps: dict[str, torch.Tensor] = field(default_factory=dict)   # kind -> (L, T), "head" -> (L, H)
    metric_name: str = "logit difference"
    layers: list[int] = field(default_factory=list)               # the blocks the maps' rows are

    def to_dict(self) -> dict:
        return {"clean_tokens": self.clean_tokens, "corrupt_tokens": self.corrupt_tokens,
                "clean_metric": self.clean_metric, "corrupt_metric": self.corrupt_metric,
                "metric": self.metric_name, "layers": self.layers,
                "maps": {k: [[round(float(x), 6) for x in row] for row in v] for k, v in self.maps.items()}}


def _caches(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, metric: Metric, position: int):
    wanted = [names.activation(i, k) for i in range(len(model.blocks)) for k in KINDS.values()] + [names.FINAL]
    _, cache = run_with_cache(model, clean, wanted)
    m_clean = float(metric(model.lm_head(cache[names.FINAL][:, position])))   # read exactly as run_patched reads
    m_corrupt = float(metric(run_patched(model, cache, corrupt, [[]], position)))
    if m_clean == m_corrupt:
        raise UserError("the metric is the same on the clean and the corrupted prompt: nothing to restore "
                        "(choose prompts or answers that differ)")
    return cache, m_clean, m_corrupt


@torch.no_grad()
def patch(model: GPT, clean: torch.Tensor | Sequence[int], corrupt: torch.Tensor | Sequence[int],
          sites: Sequence[Site], metric: Metric, position: int = -1) -> float:
    """The fraction of the clean metric restored when all `sites` are patched together (one run)."""
    clean, corrupt = _as_ids(model, clean), _as_ids(model, corrupt)
    _check(model, clean, corrupt, sites)
    cache, m_clean, m_corrupt = _caches(model, clean, corrupt, metric, position)
    m = float(metric(run_patched(model, cache, corrupt, [list(sites)], position)))
    return (m - m_corrupt) / (m_clean - m_corrupt)


@torch.no_grad()
def patching_maps(
    model: GPT,
    clean: torch.Tensor | Sequence[int],
    corrupt: torch.Tensor | Sequence[int],
    metric: Metric | None = None,
    kinds: Sequence[str] = ("resid_pre", "attn_out", "mlp_out", "head"),
    position: int = -1,
    tokenizer=None,
    metric_name: str = "logit difference",
    layers: Sequence[int] | None = None,
) -> Patching:
    """Patch every (layer, position) of each kind one at a time, and every head at all positions:
    maps of the fraction restored, (n_layers, T) per kind and (n_layers, n_heads) for "head".
    metric: default the logit difference between the clean and the corrupt prompt's own top-1 tokens.
    layers: only these blocks (rows of the maps, in this order); default all. Each map costs one forward
    pass per cell (batched), so n_layers x T of them for a kind: a long prompt takes a while."""
    clean, corrupt = _as_ids(model, clean), _as_ids(model, corrupt)
    _check(model, clean, corrupt, [])
    if metric is None:
        a = int(model(clean)[0][0, position].argmax())
        b = int(model(corrupt)[0][0, position].argmax())
        if a == b:
            raise UserError("both prompts predict the same next token: give the answers to compare explicitly")
        metric = logit_diff(a, b)
    cache, m_clean, m_corrupt = _caches(model, clean, corrupt, metric, position)
    rows = list(range(len(model.blocks))) if layers is None else [check_layer(model, i) for i in layers]
    L, T, H = len(rows), clean.size(1), model.attention(0).n_heads
    per_run = max(1, MAX_BATCH_BYTES // (T * (8 * model.cfg.d_model + 3 * model.cfg.hidden) * 4))
    result = Patching(_texts(tokenizer, clean), _texts(tokenizer, corrupt), m_clean, m_corrupt,
                      metric_name=metric_name, layers=rows)
    for kind in kinds:
        if kind == "head":
            groups = [[Site("head", i, None, h)] for i in rows for h in range(H)]
        else:
            groups = [[Site(kind, i, t)] for i in rows for t in range(T)]
        _check(model, clean, corrupt, [g[0] for g in groups])
        values = torch.cat([metric(run_patched(model, cache, corrupt, groups[a:a + per_run], position)).float()
                            for a in range(0, len(groups), per_run)])
        result.maps[kind] = ((values.double() - m_corrupt) / (m_clean - m_corrupt)).view(L, -1).cpu()
    return result


def _texts(tokenizer, idx: torch.Tensor) -> list[str]:
    ids = idx[0].tolist()
    return [tokenizer.decode([i]) for i in ids] if tokenizer is not None else [str(i) for i in ids]
