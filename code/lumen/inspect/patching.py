"""Activation patching: where does the information that decides a prediction live?

Run a clean prompt ("The Eiffel Tower is in the city of" -> " Paris") and a corrupted one of the same
length ("The Colosseum is in the city of" -> " Rome"). Then run the corrupted prompt again with one
activation copied in from the clean run, at one site: the stream entering block i, a block's attention
or MLP output, one head's output, query, key, value or attention pattern, at one position (or all). How
much of the clean answer comes back?

    restored = (metric(patched) - metric(corrupt)) / (metric(clean) - metric(corrupt))

0: that site carries none of what the clean prompt adds; 1: all of it. The metric is by default the
logit difference between the clean answer and the corrupt answer at the last position.

    >>> r = patching_maps(model, clean_ids, corrupt_ids)           # doctest: +SKIP
    >>> r.maps["resid_pre"].shape                      # (n_layers, T)   # doctest: +SKIP

`patch` runs the definition itself: one forward pass of the corrupted prompt with hooks (lumen.inspect.hooks)
pasting the clean activations in. `patching_maps` computes a whole map of such runs at once, with the same
hooks, as many patched copies in one batch, each run only where it can differ from the corrupted run: from the
block it patches up, and from the first position its patch changes on (a causal model's earlier positions are
the corrupted run's: their keys and values come from a KV cache of it). A cell whose clean and corrupted
activations are equal is the corrupted run itself, and is 0 without running. Both take a padded `Batch` of
pairs too (prompts of different lengths, each clean prompt as long as its corrupted one): per pair, and
over the dataset. lumen.inspect.path_patching builds on the same machinery; lumen.inspect.attribution_patching
estimates every cell from one forward and one backward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import overload

import torch
import torch.nn.functional as F

from .. import names
from ..attention import KVCache, LayerCache
from ..errors import UserError
from ..model import GPT
from ..progress import progress
from ..tokenizers import Batch
from ..tokenizers.shown import token_texts
from .cache import run_with_cache
from .hooks import check_layer, hooked

# the maps patching_maps draws by default: site kind -> the named activation it patches
KINDS = {"resid_pre": "resid_pre", "attn_out": "attn_out", "mlp_out": "mlp_out", "head": "z"}
# the sites inside attention, one head each (k and v: one KV head, shared by its group of query heads)
HEAD_KINDS = {"head": "z", "q": "q", "k": "k", "v": "v", "pattern": "attn_pattern"}
SITES = KINDS | HEAD_KINDS
MAX_BATCH_BYTES = 256 * 2**20   # roughly the activations of the patched copies run at once

Metric = Callable[[torch.Tensor], torch.Tensor]   # logits at the metric's position (n, V) -> (n,)


@dataclass(frozen=True)
class Site:
    """One place to copy the clean activation into the corrupted run. position None: every position (for
    "pattern", every query); head: which head (the head kinds only: HEAD_KINDS)."""

    kind: str
    layer: int
    position: int | None = None
    head: int | None = None

    @property
    def name(self) -> str:
        return names.activation(self.layer, SITES[self.kind])


def logit_diff(answer: int, wrong: int) -> Metric:
    """logit[answer] - logit[wrong]: how much the model prefers the clean answer over the corrupt one."""
    return lambda z: z[..., answer] - z[..., wrong]


def logprob(answer: int) -> Metric:
    """log p(answer)."""
    return lambda z: F.log_softmax(z.float(), -1)[..., answer]


def index(kind: str, position: int | slice | None, head: int | None) -> tuple:
    """Where a site sits in one prompt's activation: (T, d), (T, heads, d_head), or a pattern's (heads, T, S)."""
    p = slice(None) if position is None else position
    if kind == "attn_pattern":
        return (slice(None) if head is None else head, p)
    return (p,) if head is None else (p, head)


def _position_axis(kind: str) -> int:
    return 1 if kind == "attn_pattern" else 0


def check_site(model: GPT, s: Site, T: int) -> None:
    if s.kind not in SITES:
        raise UserError(f"unknown site kind {s.kind!r}; kinds are {', '.join(SITES)}")
    check_layer(model, s.layer)
    if s.position is not None and not -T <= s.position < T:
        raise UserError(f"position {s.position} is outside the prompt's {T} tokens")
    attn = model.attention(s.layer)
    H = attn.n_kv_heads if s.kind in ("k", "v") else attn.n_heads
    if (s.kind in HEAD_KINDS) != (s.head is not None) or (s.head is not None and not 0 <= s.head < H):
        which = "KV head" if s.kind in ("k", "v") else "head"
        raise UserError(f"site {s}: a {s.kind} site needs a {which} in 0..{H - 1}; other kinds none")


def _check_pair(clean: torch.Tensor, corrupt: torch.Tensor) -> None:
    if clean.shape != corrupt.shape:
        raise UserError(f"the clean and the corrupted prompt must have the same number of tokens, got "
                        f"{clean.size(-1)} and {corrupt.size(-1)} (reword one so that they tokenize alike)")
    if clean.numel() == 0:
        raise UserError("empty prompts: give at least one token")


def _as_ids(model: GPT, idx: torch.Tensor | Sequence[int]) -> torch.Tensor:
    idx = torch.as_tensor(idx, dtype=torch.long, device=model.device)
    return idx[None] if idx.dim() == 1 else idx


# --- the definition: one forward pass with the clean activations pasted in --------------------------------

@torch.no_grad()
def patch(model: GPT, clean: torch.Tensor | Sequence[int], corrupt: torch.Tensor | Sequence[int],
          sites: Sequence[Site], metric: Metric, position: int = -1) -> float:
    """The fraction of the clean metric restored when all `sites` are patched together: one forward pass of
    the corrupted prompt with hooks writing the clean activations in (`lumen.inspect.hooks`)."""
    clean, corrupt = _as_ids(model, clean), _as_ids(model, corrupt)
    _check_pair(clean, corrupt)
    T = clean.size(1)
    for s in sites:
        check_site(model, s, T)
    _, cache = run_with_cache(model, clean, sorted({s.name for s in sites}))

    def paste(a: torch.Tensor, name: str) -> torch.Tensor:
        a = a.clone()
        for s in sites:
            if s.name == name:
                where = index(SITES[s.kind], s.position, s.head)
                a[0][where] = cache[name][0][where]
        return a

    m_clean = float(metric(model(clean)[0][:, position]))
    m_corrupt = float(metric(model(corrupt)[0][:, position]))
    if m_clean == m_corrupt:
        raise UserError("the metric is the same on the clean and the corrupted prompt: nothing to restore "
                        "(choose prompts or answers that differ)")
    with hooked(model, [(n, paste) for n in {s.name for s in sites}]):
        m = float(metric(model(corrupt)[0][:, position]))
    return (m - m_corrupt) / (m_clean - m_corrupt)


# --- many patched copies at once ------------------------------------------------------------------------

@dataclass
class Copy:
    """One patched copy of the corrupted run. It differs from that run from block `layer` and position
    `start` on (so it is run only there); `writes` are (activation name, position or None, head or None,
    the values to write: that activation for one whole prompt); `records` the activations to keep."""

    layer: int
    start: int
    writes: Sequence[tuple[str, int | None, int | None, torch.Tensor]]
    records: list[str] = field(default_factory=list)


class Corrupted:
    """What the patched copies of a corrupted prompt (1, T) reuse of its own run: the stream entering every
    block, every layer's keys and values (a KV cache), and the named activations asked for."""

    def __init__(self, model: GPT, ids: torch.Tensor, wanted: Sequence[str]):
        L = len(model.blocks)
        streams = [names.activation(i, "resid_pre") for i in range(L)]
        _, self.cache = run_with_cache(model, ids, sorted(set(streams) | set(wanted)))
        self.kv = KVCache(model.cfg, 1, ids.size(1), model.device, model.dtype)
        with torch.no_grad():
            model(ids, cache=self.kv)
        self.T = ids.size(1)


def _rows_per_batch(model: GPT, positions: int) -> int:
    return max(1, MAX_BATCH_BYTES // (positions * (8 * model.cfg.d_model + 3 * model.cfg.hidden) * 4))


@torch.no_grad()
def run_copies(model: GPT, corrupted: Corrupted, copies: Sequence[Copy], position: int = -1
               ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Logits (len(copies), V) at `position` of every patched copy, and what each recorded (the whole prompt's
    activation: the corrupted run's before the copy's start). Copies that start at the same position run as
    one batch that grows block by block as copies enter: a copy is the corrupted stream up to its block, and
    the corrupted run's keys and values before its start position are a KV cache."""
    T = corrupted.T
    p = position % T
    out: torch.Tensor | None = None   # filled a batch at a time (stacking one row per copy costs seconds)
    kept: list[dict[str, torch.Tensor]] = [{} for _ in copies]
    by_start: dict[int, list[int]] = {}
    for c, copy in enumerate(copies):
        if copy.start > p:
            raise UserError(f"a copy starting at position {copy.start} cannot change position {p}")
        by_start.setdefault(copy.start, []).append(c)
    # a copy's work: the blocks from its own up, over the positions from its start to p (the bar's unit)
    work = [(len(model.blocks) - copy.layer) * (p + 1 - copy.start) for copy in copies]
    with progress(total=sum(work), desc="patching", unit=" block-positions") as bar:
        for s, members in sorted(by_start.items()):
            members.sort(key=lambda c: copies[c].layer)
            per = _rows_per_batch(model, p + 1 - s)
            for a in range(0, len(members), per):
                chunk = members[a:a + per]
                logits, recorded = _run_group(model, corrupted, [copies[c] for c in chunk], s, p)
                if out is None:
                    out = logits.new_empty(len(copies), logits.size(-1))
                out[torch.tensor(chunk, device=logits.device)] = logits
                for r, c in enumerate(chunk):
                    kept[c] = recorded[r]
                bar.update(sum(work[c] for c in chunk))
    if out is None:
        raise UserError("no patched copies to run: give at least one")
    return out, kept


def _run_group(model: GPT, corrupted: Corrupted, copies: list[Copy], s: int, p: int
               ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Copies sorted by their block, all starting at position s: positions s..p, blocks from the first copy's up."""
    rows_at: dict[str, list[tuple[int, tuple, int | None, torch.Tensor]]] = {}
    for r, copy in enumerate(copies):
        for name, pos, head, values in copy.writes:
            pos = None if pos is None else pos % corrupted.T   # (a site may count positions from the end)
            layer, kind, _ = names.parse(name)
            if layer is None or layer < copy.layer:
                raise UserError(f"a copy entering at block {copy.layer} cannot write {name}")
            if pos is not None and not s <= pos <= p:
                continue   # before the copy's start: the clean value is the corrupted one; after p: never read
            local = index(kind, None if pos is None else pos - s, head)
            suffix = values.narrow(_position_axis(kind), s, p + 1 - s)
            if kind == "attn_pattern":    # the keys a query up to p can see
                suffix = suffix[..., :p + 1]
            rows_at.setdefault(name, []).append((r, local, head, suffix))
    recording = {name for copy in copies for name in copy.records}
    recorded: list[dict[str, torch.Tensor]] = [{} for _ in copies]

    def hook(a: torch.Tensor, name: str) -> torch.Tensor | None:
        for r, copy in enumerate(copies[:a.size(0)]):
            if name in copy.records:
                recorded[r][name] = a[r].clone()
        if name not in rows_at:
            return None
        a = a.clone()
        for r, local, _, suffix in rows_at[name]:
            a[r][local] = suffix[local]
        return a

    first = copies[0].layer
    entering = torch.tensor([c.layer for c in copies])
    x = None
    with hooked(model, [(n, hook) for n in set(rows_at) | recording]):
        for j in range(first, len(model.blocks)):
            n_new = int((entering == j).sum())
            if n_new:
                stream = corrupted.cache[names.activation(j, "resid_pre")][:, s:p + 1]
                new = stream.expand(n_new, -1, -1)
                x = new if x is None else torch.cat([x, new])
            assert x is not None
            kv = corrupted.kv.layers[j]
            length = torch.tensor(s, device=x.device)
            kv_j = LayerCache(kv.k[:, :, :p + 1].expand(x.size(0), -1, -1, -1).clone(),
                              kv.v[:, :, :p + 1].expand(x.size(0), -1, -1, -1).clone(), length)
            x = model.blocks[j](x, None, kv_j)
    assert x is not None
    logits = model.logit_cap(model.lm_head(model.ln_f(x[:, -1])))   # (soft-capped, as the model's own)
    full = [{name: _whole(corrupted, name, a, s, p) for name, a in rec.items()} for rec in recorded]
    return logits, full


def _whole(corrupted: Corrupted, name: str, suffix: torch.Tensor, s: int, p: int) -> torch.Tensor:
    """A recorded activation of positions s..p as the whole prompt's: the corrupted run's elsewhere."""
    ax = _position_axis(names.parse(name).kind)
    base = corrupted.cache[name][0].clone()
    base.narrow(ax, s, p + 1 - s).copy_(suffix)
    return base


def first_change(clean: torch.Tensor, corrupt: torch.Tensor, kind: str, position: int | None, head: int | None
                 ) -> int | None:
    """The first position at which patching a site changes the corrupted run (clean and corrupted values
    differ), or None if it changes nothing. clean, corrupt: one prompt's activation."""
    where = index(kind, position, head)
    a, b = clean[where], corrupt[where]
    if position is not None:
        return None if torch.equal(a, b) else position
    ax = 1 if kind == "attn_pattern" and head is None else 0
    differs = (a != b).flatten(ax + 1).any(-1) if a.dim() > ax + 1 else (a != b)
    if ax:
        differs = differs.any(0)
    hits = differs.nonzero()
    return int(hits[0]) if len(hits) else None


@dataclass
class Patching:
    """What patching restored: clean and corrupt metric values and, per site kind, a map of fractions."""

    clean_tokens: list[str]
    corrupt_tokens: list[str]
    clean_metric: float
    corrupt_metric: float
    maps: dict[str, torch.Tensor] = field(default_factory=dict)   # kind -> (L, T), head kinds -> (L, H) or (L, H, T)
    metric_name: str = "logit difference"
    layers: list[int] = field(default_factory=list)               # the blocks the maps' rows are
    method: str = "exact"                                          # or "attribution" (an estimate)

    def to_dict(self) -> dict:
        return {"clean_tokens": self.clean_tokens, "corrupt_tokens": self.corrupt_tokens,
                "clean_metric": self.clean_metric, "corrupt_metric": self.corrupt_metric,
                "metric": self.metric_name, "layers": self.layers, "method": self.method,
                "maps": {k: _rounded(v.tolist()) for k, v in self.maps.items()}}

    def values(self, kind: str) -> torch.Tensor:
        """A map as metric values rather than fractions restored."""
        return self.corrupt_metric + self.maps[kind] * (self.clean_metric - self.corrupt_metric)


@dataclass
class PatchingSet:
    """Patching over a dataset of pairs: each pair's own result, and their mean."""

    pairs: list[Patching]

    @property
    def clean_metric(self) -> float:
        """The metric on the clean prompts, averaged over the pairs."""
        return sum(p.clean_metric for p in self.pairs) / len(self.pairs)

    @property
    def corrupt_metric(self) -> float:
        """The metric on the corrupted prompts, averaged over the pairs."""
        return sum(p.corrupt_metric for p in self.pairs) / len(self.pairs)

    def mean(self, kind: str) -> torch.Tensor:
        """The fraction restored over the dataset: (mean patched metric - mean corrupt) / (mean clean - mean
        corrupt), so that pairs whose difference is small do not dominate. Maps over positions are aligned
        at the last token (column -1 is every prompt's last position), over the positions all pairs have."""
        n = min(p.maps[kind].size(-1) for p in self.pairs) if kind in POSITIONAL or self.by_position(kind) else None
        vals = [p.values(kind) if n is None else p.values(kind)[..., -n:] for p in self.pairs]
        clean, corrupt = self.clean_metric, self.corrupt_metric
        return (torch.stack(vals).mean(0) - corrupt) / (clean - corrupt)

    def averaged(self, metric_name: str | None = None) -> Patching:
        """The dataset as one Patching: the mean clean and corrupt metrics and every kind's mean map, its
        positions named by their distance from each pair's end ("-3", "-2", "-1"); what the figures draw."""
        first = self.pairs[0]
        T = min(len(p.clean_tokens) for p in self.pairs)
        columns = [str(t) for t in range(-T, 0)]
        return Patching(columns, [], self.clean_metric, self.corrupt_metric, {k: self.mean(k) for k in first.maps},
                        metric_name or first.metric_name, first.layers, first.method)

    def by_position(self, kind: str) -> bool:
        return kind in HEAD_KINDS and self.pairs[0].maps[kind].dim() == 3

    def to_dict(self) -> dict:
        first = self.pairs[0]
        return {"pairs": [p.to_dict() for p in self.pairs], "metric": first.metric_name, "method": first.method,
                "layers": first.layers, "mean": {k: _rounded(self.mean(k).tolist()) for k in first.maps}}


POSITIONAL = ("resid_pre", "attn_out", "mlp_out")


def _rounded(x):
    return [_rounded(v) for v in x] if isinstance(x, list) else round(float(x), 6)


def sites_of(model: GPT, kind: str, layers: Sequence[int], T: int, by_position: bool = False) -> list[Site]:
    """Every cell of one map: (layer, position) for the stream kinds, (layer, head) or (layer, head, position)
    for the head kinds (k and v: KV heads)."""
    if kind not in SITES:
        raise UserError(f"unknown site kind {kind!r}; kinds are {', '.join(SITES)}")
    if kind not in HEAD_KINDS:
        return [Site(kind, i, t) for i in layers for t in range(T)]
    attn = model.attention(0)
    H = attn.n_kv_heads if kind in ("k", "v") else attn.n_heads
    if by_position:
        return [Site(kind, i, t, h) for i in layers for h in range(H) for t in range(T)]
    return [Site(kind, i, None, h) for i in layers for h in range(H)]


def _pairs(model: GPT, clean, corrupt) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A pair of prompts, or the pairs of two padded Batches (each clean prompt as long as its corrupted one)."""
    if isinstance(clean, Batch) != isinstance(corrupt, Batch):
        raise UserError("give the clean and the corrupted prompts alike: both Batches, or both one prompt")
    if isinstance(clean, Batch):
        if len(clean) != len(corrupt):
            raise UserError(f"{len(clean)} clean prompts but {len(corrupt)} corrupted ones: give one of each per pair")
        found = []
        for b, (x, y) in enumerate(zip(clean.rows(), corrupt.rows())):
            if len(x) != len(y):
                raise UserError(f"pair {b}: the clean prompt has {len(x)} tokens, the corrupted one {len(y)}; each "
                                "pair must tokenize to the same length (pairs may differ from each other)")
            found.append((_as_ids(model, x), _as_ids(model, y)))
        return found
    pair = (_as_ids(model, clean), _as_ids(model, corrupt))
    _check_pair(*pair)
    return [pair]


def _metrics(model: GPT, pairs: list[tuple[torch.Tensor, torch.Tensor]], metric: Metric | Sequence[Metric] | None,
             position: int) -> list[Metric]:
    if metric is None:   # each pair's own: the clean and the corrupt prompt's top-1 tokens
        found = []
        for clean, corrupt in pairs:
            a = int(model(clean)[0][0, position].argmax())
            b = int(model(corrupt)[0][0, position].argmax())
            if a == b:
                raise UserError("both prompts predict the same next token: give the answers to compare explicitly")
            found.append(logit_diff(a, b))
        return found
    if callable(metric):
        return [metric] * len(pairs)
    metrics = list(metric)
    if len(metrics) != len(pairs):
        raise UserError(f"{len(metrics)} metrics for {len(pairs)} pairs: give one, or one per pair")
    return metrics


@overload
def patching_maps(model: GPT, clean: Batch, corrupt: Batch, metric: Metric | Sequence[Metric] | None = ...,
                  kinds: Sequence[str] = ..., position: int = ..., tokenizer=..., metric_name: str = ...,
                  layers: Sequence[int] | None = ..., by_position: bool = ...) -> PatchingSet: ...
@overload
def patching_maps(model: GPT, clean: torch.Tensor | Sequence[int], corrupt: torch.Tensor | Sequence[int],
                  metric: Metric | Sequence[Metric] | None = ..., kinds: Sequence[str] = ..., position: int = ...,
                  tokenizer=..., metric_name: str = ..., layers: Sequence[int] | None = ...,
                  by_position: bool = ...) -> Patching: ...
@torch.no_grad()
def patching_maps(
    model: GPT,
    clean: torch.Tensor | Sequence[int] | Batch,
    corrupt: torch.Tensor | Sequence[int] | Batch,
    metric: Metric | Sequence[Metric] | None = None,
    kinds: Sequence[str] = ("resid_pre", "attn_out", "mlp_out", "head"),
    position: int = -1,
    tokenizer=None,
    metric_name: str = "logit difference",
    layers: Sequence[int] | None = None,
    by_position: bool = False,
) -> Patching | PatchingSet:
    """Patch every cell of each kind's map one at a time: the fraction restored, (n_layers, T) per stream kind
    ("resid_pre", "attn_out", "mlp_out") and (n_layers, heads) per head kind ("head", "q", "k", "v", "pattern";
    k and v per KV head), or (n_layers, heads, T) with by_position=True.
    metric: default the logit difference between the clean and the corrupt prompt's own top-1 tokens.
    layers: only these blocks (rows of the maps, in this order); default all. The copies run as batches
    (see `run_copies`). Two Batches of pairs give a PatchingSet (each pair's maps, and the mean); then metric
    may be one per pair."""
    pairs = _pairs(model, clean, corrupt)
    metrics = _metrics(model, pairs, metric, position)
    rows = list(range(len(model.blocks))) if layers is None else [check_layer(model, i) for i in layers]
    results = [_maps(model, c, x, m, kinds, position, tokenizer, metric_name, rows, by_position)
               for (c, x), m in zip(pairs, metrics)]
    return PatchingSet(results) if isinstance(clean, Batch) else results[0]


def _maps(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, metric: Metric, kinds: Sequence[str],
          position: int, tokenizer, metric_name: str, rows: list[int], by_position: bool) -> Patching:
    T = clean.size(1)
    p = position % T
    cells = {kind: sites_of(model, kind, rows, T, by_position) for kind in kinds}
    wanted = sorted({s.name for sites in cells.values() for s in sites})
    both = torch.cat([clean, corrupt])
    logits, cache = run_with_cache(model, both, wanted)
    m_clean, m_corrupt = float(metric(logits[:1, p])), float(metric(logits[1:, p]))
    if m_clean == m_corrupt:
        raise UserError("the metric is the same on the clean and the corrupted prompt: nothing to restore "
                        "(choose prompts or answers that differ)")
    corrupted = Corrupted(model, corrupt, wanted)
    copies, where = [], []
    for kind, sites in cells.items():
        for c, site in enumerate(sites):
            act = SITES[kind]
            start = first_change(cache[site.name][0], cache[site.name][1], act, site.position, site.head)
            if start is None or start > p:
                continue   # the corrupted run itself, or a change after the position read: 0 restored
            copies.append(Copy(site.layer, start, [(site.name, site.position, site.head, cache[site.name][0])]))
            where.append((kind, c))
    values = {kind: torch.full((len(sites),), m_corrupt, dtype=torch.float64) for kind, sites in cells.items()}
    if copies:
        z, _ = run_copies(model, corrupted, copies, p)
        for (kind, c), m in zip(where, metric(z).double().cpu()):
            values[kind][c] = m
    result = Patching(_texts(tokenizer, clean), _texts(tokenizer, corrupt), m_clean, m_corrupt,
                      metric_name=metric_name, layers=rows)
    for kind in cells:
        shape = (len(rows), -1, T) if kind in HEAD_KINDS and by_position else (len(rows), -1)
        result.maps[kind] = ((values[kind] - m_corrupt) / (m_clean - m_corrupt)).view(shape)
    return result


def _texts(tokenizer, idx: torch.Tensor) -> list[str]:
    ids = idx[0].tolist()
    return token_texts(tokenizer, ids)
