"""Attribution patching (Nanda 2023; Kramár et al. 2024): activation patching estimated to first order.

Patching a site from its corrupted value a* to its clean value a changes the metric by about

    d metric  ~  grad_a metric (at the corrupted run) . (a - a*)

so one backward pass through the corrupted run, beside one forward pass of each prompt, estimates every
cell of every map at once (`patching_maps` runs one patched copy per cell). The estimate is exact where the
metric is linear in the site, e.g. a write of the last block read through a final norm whose scale stays
put; elsewhere it is a tangent-line guess, poor where a patch moves a nonlinearity far (the stream at the
subject's position in early blocks, an attention softmax that flips): check the cells that matter with
exact patching. The maps come back as `patching.Patching`s with method "attribution", beside exact ones.

    >>> est = attribution_patching(model, clean_ids, corrupt_ids, logit_diff(paris, rome))   # doctest: +SKIP
    >>> est.maps["head"].shape                                     # (n_layers, heads)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import torch

from .. import names
from ..errors import UserError
from ..model import GPT
from ..tokenizers import Batch, pad
from .cache import run_with_cache
from .hooks import check_layer, hooked
from .patching import SITES, Metric, Patching, PatchingSet, _pairs, _texts, logit_diff


@overload
def attribution_patching(model: GPT, clean: Batch, corrupt: Batch, metric: Metric | Sequence[Metric] | None = ...,
                         kinds: Sequence[str] = ..., position: int = ..., tokenizer=..., metric_name: str = ...,
                         layers: Sequence[int] | None = ..., by_position: bool = ...) -> PatchingSet: ...
@overload
def attribution_patching(model: GPT, clean: torch.Tensor | Sequence[int], corrupt: torch.Tensor | Sequence[int],
                         metric: Metric | Sequence[Metric] | None = ..., kinds: Sequence[str] = ...,
                         position: int = ..., tokenizer=..., metric_name: str = ...,
                         layers: Sequence[int] | None = ..., by_position: bool = ...) -> Patching: ...
@torch.no_grad()
def attribution_patching(
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
    """The maps of `patching_maps` (same arguments, same shapes), estimated from one forward pass of the clean
    prompts, and one forward and one backward pass of the corrupted ones, all pairs of a Batch together.
    position: which of each prompt's own tokens the metric reads (default its last)."""
    pairs = _pairs(model, clean, corrupt)
    for kind in kinds:
        if kind not in SITES:
            raise UserError(f"unknown site kind {kind!r}; kinds are {', '.join(SITES)}")
    rows = list(range(len(model.blocks))) if layers is None else [check_layer(model, i) for i in layers]
    lengths = [c.size(1) for c, _ in pairs]
    good = pad([c[0].tolist() for c, _ in pairs], "left")
    bad = pad([x[0].tolist() for _, x in pairs], "left")
    ids, mask = good.ids.to(model.device), good.mask.to(model.device)
    cols = [good.ids.size(1) - n + (position % n) for n in lengths]    # the column each metric reads
    wanted = [names.activation(i, SITES[k]) for k in kinds for i in rows]
    clean_logits, clean_cache = run_with_cache(model, ids, wanted, mask=mask)
    metrics = _metrics(clean_logits, bad, cols, metric, model)
    acts, grads, corrupt_logits = _corrupt_gradients(model, bad.ids.to(model.device), mask, wanted, metrics, cols)
    results = []
    for b, (c, x) in enumerate(pairs):
        m_clean = float(metrics[b](clean_logits[b:b + 1, cols[b]]))
        m_corrupt = float(metrics[b](corrupt_logits[b:b + 1, cols[b]]))
        if m_clean == m_corrupt:
            raise UserError(f"pair {b}: the metric is the same on the clean and the corrupted prompt: nothing to "
                            "restore (choose prompts or answers that differ)")
        real = mask[b]
        r = Patching(_texts(tokenizer, c), _texts(tokenizer, x), m_clean, m_corrupt, metric_name=metric_name,
                     layers=rows, method="attribution")
        for kind in kinds:
            cells = []
            for i in rows:
                n = names.activation(i, SITES[kind])
                d = (clean_cache[n][b] - acts[n][b]).double() * grads[n][b].double()
                cells.append(_cells(SITES[kind], d, real, by_position))
            r.maps[kind] = (torch.stack(cells) / (m_clean - m_corrupt)).cpu()
        results.append(r)
    return PatchingSet(results) if isinstance(clean, Batch) else results[0]


def _cells(kind: str, d: torch.Tensor, real: torch.Tensor, by_position: bool) -> torch.Tensor:
    """One layer's row of a map from gradient x difference d of one prompt: per position (T,), per head (H,),
    or per head and position (H, T); real: the prompt's columns in the padded batch."""
    if kind == "attn_pattern":                    # (H, T, S): summed over the keys
        per = d.sum(-1)[:, real]                  # (H, T)
        return per if by_position else per.sum(-1)
    if kind in ("z", "q", "k", "v"):              # (T, H, hd)
        per = d.sum(-1)[real].T                   # (H, T)
        return per if by_position else per.sum(-1)
    return d.sum(-1)[real]                        # (T,)


def _metrics(clean_logits: torch.Tensor, bad: Batch, cols: list[int], metric, model: GPT) -> list[Metric]:
    if metric is None:   # each pair's own: the clean and the corrupt prompt's top-1 tokens
        with torch.no_grad():
            corrupt_logits, _ = model(bad.ids.to(model.device), mask=bad.mask.to(model.device))
        found = []
        for b, col in enumerate(cols):
            a, w = int(clean_logits[b, col].argmax()), int(corrupt_logits[b, col].argmax())
            if a == w:
                raise UserError("both prompts predict the same next token: give the answers to compare explicitly")
            found.append(logit_diff(a, w))
        return found
    if callable(metric):
        return [metric] * len(cols)
    metrics = list(metric)
    if len(metrics) != len(cols):
        raise UserError(f"{len(metrics)} metrics for {len(cols)} pairs: give one, or one per pair")
    return metrics


def _corrupt_gradients(model: GPT, ids: torch.Tensor, mask: torch.Tensor, wanted: list[str], metrics: list[Metric],
                       cols: list[int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """The corrupted run's activations at `wanted`, the gradients of the sum of the pairs' metrics with respect to
    them (one backward pass: the prompts do not mix), and its logits. The weights are not differentiated."""
    acts: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}

    def leaf(a: torch.Tensor, name: str) -> torch.Tensor:   # differentiate from the embedding up, not the weights
        return a.detach().requires_grad_(True)

    def keep(a: torch.Tensor, name: str) -> None:
        acts[name] = a.detach()

    def keep_grad(g: torch.Tensor, name: str) -> None:
        grads[name] = g.detach()

    frozen = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in frozen:
            p.requires_grad_(False)
        with torch.enable_grad():
            with hooked(model, [(names.EMBED, leaf)] + [(n, keep) for n in wanted], [(n, keep_grad) for n in wanted]):
                logits, _ = model(ids, mask=mask)
            total = sum(m(logits[b:b + 1, col]).sum() for b, (m, col) in enumerate(zip(metrics, cols)))
            assert isinstance(total, torch.Tensor)
            total.backward()
    finally:
        for p, req in frozen:
            p.requires_grad_(req)
    for n in wanted:   # a site the metric does not depend on gets no gradient: 0
        grads.setdefault(n, torch.zeros_like(acts[n]))
    return acts, grads, logits.detach()


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson's r between two maps over the cells both have (NaN-free): how well one ranks cells as the other."""
    a, b = a.flatten().double(), b.flatten().double()
    keep = ~(a.isnan() | b.isnan())
    return float(torch.corrcoef(torch.stack([a[keep], b[keep]]))[0, 1])


def agreement(exact: Patching | PatchingSet, estimate: Patching | PatchingSet) -> dict[str, dict[str, float]]:
    """How far to trust the estimate: per site kind, Pearson's r between attribution patching's map and exact
    patching's ("map"); for a dataset, r of the mean maps ("mean") and of every pair's cells together ("cells")."""
    found: dict[str, dict[str, float]] = {}
    if isinstance(exact, Patching) and isinstance(estimate, Patching):
        for kind in exact.maps:
            found[kind] = {"map": correlation(exact.maps[kind], estimate.maps[kind])}
        return found
    if not (isinstance(exact, PatchingSet) and isinstance(estimate, PatchingSet)):
        raise UserError("compare a Patching with a Patching, or a PatchingSet with a PatchingSet")
    for kind in exact.pairs[0].maps:
        cells = [torch.cat([p.maps[kind].flatten() for p in s.pairs]) for s in (exact, estimate)]
        found[kind] = {"mean": correlation(exact.mean(kind), estimate.mean(kind)), "cells": correlation(*cells)}
    return found


__all__ = ["agreement", "attribution_patching", "correlation"]
