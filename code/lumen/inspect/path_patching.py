"""Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): how much of the clean answer travels from
one head (the sender) to others (the receivers) directly, rather than by any route at all.

Activation patching a head's output restores what flows from it along every path. Path patching restores
only the path sender -> receivers, in two runs of the corrupted prompt:

  1. the sender's output z is the clean run's, every head after it is held at the corrupted run's (the
     MLPs run as they will), and the receivers' inputs (their queries, keys or values) are recorded:
     what they read of the sender, straight through the stream (and through MLPs);
  2. the receivers' inputs are set to those recorded values, and nothing else is touched.

The metric of run 2, normalised as in activation patching, is the fraction the path restores. A receiver
is a `Site` of kind "q", "k" or "v" (one head's, every position or one; k and v are KV heads, shared by a
group of query heads); or `names.FINAL`: the read-out itself, so that run 1's metric is the sender's
direct effect on the logits (through the MLPs after it too).

    >>> r = path_patching(model, clean, corrupt, logit_diff(mary, john), [Site("q", 9, None, 6)])  # doctest: +SKIP
    >>> r.maps["head"].shape                               # every sender: (n_layers, heads)  # doctest: +SKIP

Both runs are patched copies of `lumen.inspect.patching.run_copies`: every sender at once, each from its
own block and first changed position up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import names
from ..errors import UserError
from ..model import GPT
from ..tokenizers import Batch
from .cache import run_with_cache
from .patching import (
    Copy,
    Corrupted,
    Metric,
    Patching,
    PatchingSet,
    Site,
    _metrics,
    _pairs,
    _texts,
    check_site,
    first_change,
    run_copies,
)

RECEIVER_KINDS = ("q", "k", "v")


@torch.no_grad()
def path_patching(
    model: GPT,
    clean: torch.Tensor | Sequence[int] | Batch,
    corrupt: torch.Tensor | Sequence[int] | Batch,
    metric: Metric | Sequence[Metric] | None,
    receivers: Sequence[Site] | str,
    senders: Sequence[tuple[int, int]] | None = None,
    position: int = -1,
    tokenizer=None,
    metric_name: str = "logit difference",
) -> Patching | PatchingSet:
    """The fraction of the clean metric restored by the path from each sender head (layer, head) to the
    receivers (see the module docstring): maps["head"] (n_layers, heads), NaN for heads not upstream of every
    receiver (default senders: all of those). Two Batches of pairs give a PatchingSet."""
    pairs = _pairs(model, clean, corrupt)
    metrics = _metrics(model, pairs, metric, position)
    final = receivers == names.FINAL
    recv: list[Site] = [] if final else list(receivers)  # type: ignore[arg-type]
    if not final and (not recv or isinstance(receivers, str)):
        raise UserError(f"receivers: give q, k or v sites (lumen.inspect.patching.Site) or {names.FINAL!r}")
    for s in recv:
        if s.kind not in RECEIVER_KINDS:
            raise UserError(f"receiver {s}: a receiver is a head's input, kind q, k or v (or {names.FINAL!r})")
        check_site(model, s, pairs[0][0].size(1))
    L, H = len(model.blocks), model.attention(0).n_heads
    top = L if final else min(s.layer for s in recv)
    found = list(senders) if senders is not None else [(i, h) for i in range(top) for h in range(H)]
    for i, h in found:
        if not 0 <= i < top or not 0 <= h < H:
            raise UserError(f"sender head ({i}, {h}) is not upstream of every receiver: senders are heads of blocks "
                            f"0..{top - 1}, heads 0..{H - 1}")
    results = [_paths(model, c, x, m, recv, found, position, tokenizer, metric_name)
               for (c, x), m in zip(pairs, metrics)]
    return PatchingSet(results) if isinstance(clean, Batch) else results[0]


def _paths(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, metric: Metric, receivers: list[Site],
           senders: list[tuple[int, int]], position: int, tokenizer, metric_name: str) -> Patching:
    L, H, T = len(model.blocks), model.attention(0).n_heads, clean.size(1)
    p = position % T
    zs = [names.activation(i, "z") for i in range(L)]
    wanted = sorted(set(zs) | {s.name for s in receivers})
    logits, cache = run_with_cache(model, torch.cat([clean, corrupt]), wanted)
    m_clean, m_corrupt = float(metric(logits[:1, p])), float(metric(logits[1:, p]))
    if m_clean == m_corrupt:
        raise UserError("the metric is the same on the clean and the corrupted prompt: nothing to restore "
                        "(choose prompts or answers that differ)")
    corrupted = Corrupted(model, corrupt, wanted)
    restored = torch.full((L, H), float("nan"), dtype=torch.float64)
    runs, cells = [], []
    for i, h in senders:
        start = first_change(cache[zs[i]][0], cache[zs[i]][1], "z", None, h)
        if start is None or start > p:
            restored[i, h] = 0.0   # the sender is the same in both runs (or changes after the position read)
            continue
        # the sender's head from the clean run, every later head as corrupted
        writes: list[tuple[str, int | None, int | None, torch.Tensor]] = [(zs[i], None, h, cache[zs[i]][0])]
        writes += [(zs[j], None, None, cache[zs[j]][1]) for j in range(i + 1, L)]
        runs.append(Copy(i, start, writes, [s.name for s in receivers]))
        cells.append((i, h))
    if runs:
        z1, recorded = run_copies(model, corrupted, runs, p)
        if receivers:
            second = [Copy(min(s.layer for s in receivers), run.start,
                           [(s.name, s.position, s.head, rec[s.name]) for s in receivers])
                      for run, rec in zip(runs, recorded)]
            z1, _ = run_copies(model, corrupted, second, p)
        for (i, h), m in zip(cells, metric(z1).double().cpu()):
            restored[i, h] = (float(m) - m_corrupt) / (m_clean - m_corrupt)
    result = Patching(_texts(tokenizer, clean), _texts(tokenizer, corrupt), m_clean, m_corrupt,
                      metric_name=metric_name, layers=list(range(L)), method="path")
    result.maps["head"] = restored
    return result
