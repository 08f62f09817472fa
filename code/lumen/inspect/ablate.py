"""Deleting a layer: run the model with one block skipped and see how much worse it predicts.

The residual picture predicts that a middle block can be removed with only a mild loss, because the
stream carries everything the other blocks wrote; the first block (and often the last) matter more.

    >>> table = deletion_table(model, windows)               # doctest: +SKIP
    >>> table["rows"][5]["delta"]      # loss increase (nats/token) without block 5  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..errors import UserError
from ..evaluate import evaluate
from ..model import GPT
from ..progress import progress
from .cache import check_layer, delete_blocks


def heldout_loss(model: GPT, windows: torch.Tensor) -> float:
    """Mean next-token loss (nats) over token windows (N, T), each scored on its own."""
    return evaluate(model, windows.flatten(), context=windows.size(1)).loss


@torch.no_grad()
def deletion_table(model: GPT, windows: torch.Tensor, layers: Iterable[int] | None = None) -> dict:
    """The held-out loss with each block deleted in turn, beside the intact model's.

    Returns {"baseline": loss, "rows": [{"block", "loss", "delta"}, ...]} with delta = loss - baseline."""
    if windows.dim() != 2 or windows.size(1) < 2:
        raise UserError(f"windows must be token ids of shape (N, T) with T >= 2, got {tuple(windows.shape)}")
    layers = range(len(model.blocks)) if layers is None else [check_layer(model, i) for i in layers]
    rows = []
    # one pass over the windows per deleted block and one intact, each about the same work: the bar's
    # estimate after the intact pass is the passes left at this machine's speed
    with progress(total=len(layers) + 1, desc="deleting blocks", unit="pass") as bar:
        base = heldout_loss(model, windows)
        bar.update()
        for k in layers:
            with delete_blocks(model, k):
                loss = heldout_loss(model, windows)
            rows.append({"block": k, "loss": loss, "delta": loss - base})
            bar.update()
    return {"baseline": base, "tokens": windows.numel(), "rows": rows}
