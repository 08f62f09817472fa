"""Padded batches: prompts of different lengths side by side, each row filled up to the longest with padding
on one side, and a mask that says which tokens are real.

    >>> b = pad([[5, 6, 7], [8]])                  # left: every prompt ends at the last column
    >>> b.ids.tolist(), b.mask[1].tolist()
    ([[5, 6, 7], [0, 0, 8]], [False, False, True])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import UserError

SIDES = ("left", "right")


@dataclass(frozen=True)
class Batch:
    """Prompts of different lengths side by side: ids (B, T), each row's prompt filled up to the
    longest with padding on one side (left: every prompt ends at the last column, the side generation
    needs), and mask (B, T), True at the real tokens. The model reads it as ``model(batch.ids,
    mask=batch.mask)``; lumen.inspect's tools take the Batch itself, and each prompt's results are what
    it gets alone.

        >>> b = pad([[5, 6, 7], [8]], side="right")
        >>> b.ids.tolist(), b.last.tolist(), b.row(1)
        ([[5, 6, 7], [8, 0, 0]], [2, 0], [8])
    """

    ids: torch.Tensor      # (B, T) token ids, padding included
    mask: torch.Tensor     # (B, T) bool: True at a real token
    side: str = "left"

    def __len__(self) -> int:
        return self.ids.size(0)

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) each prompt's number of tokens."""
        return self.mask.sum(-1)

    @property
    def last(self) -> torch.Tensor:
        """(B,) the column of each prompt's last token (where its next-token prediction is read)."""
        cols = torch.arange(self.mask.size(1), device=self.mask.device)
        return torch.where(self.mask, cols, -1).max(-1).values

    def row(self, b: int) -> list[int]:
        """Prompt b's own token ids, without its padding."""
        return self.ids[b][self.mask[b]].tolist()

    def rows(self) -> list[list[int]]:
        return [self.row(b) for b in range(len(self))]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.ids.to(device), self.mask.to(device), self.side)


def pad(seqs: Sequence[Sequence[int]], side: str = "left", pad_id: int = 0, what: str = "prompt") -> Batch:
    """Token-id lists of different lengths as one `Batch`, padded on `side` ("left" or "right") with pad_id."""
    if side not in SIDES:
        raise UserError(f"padding side must be left or right, got {side!r}")
    if not seqs:
        raise UserError(f"no {what}s to pad: give at least one")
    empty = [i for i, s in enumerate(seqs) if len(s) == 0]
    if empty:
        raise UserError(f"{what} {empty[0]} of {len(seqs)} is empty (no tokens): give every prompt some text")
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, s in enumerate(seqs):
        cols = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        ids[b, cols] = torch.as_tensor(list(s), dtype=torch.long)
        mask[b, cols] = True
    return Batch(ids, mask, side)
