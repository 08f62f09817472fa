"""Progress bars for jobs that take more than a few seconds: tqdm on stderr, silent when stderr is not a
terminal (piped, redirected, a test) or inside `quiet()` (the CLI's --quiet); LUMEN_PROGRESS=always draws them
anyway (into a log), LUMEN_PROGRESS=never never does.

    >>> for k in progress(range(n_layers), desc="deleting blocks", unit="block"):   # doctest: +SKIP
    ...     ...

The estimate is the machine's own: the time left is the work left divided by the rate measured so far on
this run (`seconds_left`), so a bar only estimates well when its units are equal pieces of work, counted
from the start. One job, one bar: a bar opened while one with a total is drawing stays silent, and when it
counts the same unit as a drawing one (a training run's steps inside an experiment that declared all its runs'
steps), each update() of it advances the outer bar too, so the outer one moves by work done, not by runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator

from tqdm import tqdm

_quiet = False
_drawn: list[Bar] = []   # the bars drawing now, outermost first


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No progress bars inside this block (when `on`)."""
    global _quiet
    before, _quiet = _quiet, _quiet or on
    try:
        yield
    finally:
        _quiet = before


class Bar(tqdm):
    """A tqdm bar that knows the bar it runs inside (if any): its updates in the outer bar's unit advance it."""

    def __init__(self, *args, feeds: Bar | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.feeds = feeds
        if not self.disable:
            _drawn.append(self)

    def update(self, n: float | None = 1) -> bool | None:
        if self.feeds is not None and n:
            self.feeds.update(n)
        return super().update(n)

    def close(self) -> None:
        if self in _drawn:
            _drawn.remove(self)
        super().close()


def progress(iterable: Iterable | None = None, total: int | None = None, desc: str | None = None,
             unit: str = "it", initial: int = 0, silent: bool = False) -> Bar:
    """A bar on stderr that draws only on a terminal, outside `quiet()` and when no other bar is drawing
    (`silent` keeps it from drawing too); when silent it still iterates and accepts update()/set_postfix(),
    so callers never branch on it. The bar is removed when done."""
    # a bar with a total estimates the whole job: the bars inside it stay silent; one without (an experiment
    # that trains nothing yet) leaves its parts to draw their own estimates
    estimating = any(b.total is not None for b in _drawn)
    setting = os.environ.get("LUMEN_PROGRESS", "").lower()
    # disable=None is tqdm's "off unless the stream is a terminal"
    disable = True if (_quiet or silent or estimating or setting == "never") else \
        False if setting == "always" else None
    feeds = next((b for b in reversed(_drawn) if b.unit == unit), None)
    return Bar(iterable, total=total, desc=desc, unit=unit, initial=initial, file=sys.stderr, dynamic_ncols=True,
               leave=False, disable=disable, feeds=feeds)


def seconds_left(bar: tqdm) -> float | None:
    """The bar's estimate: the work left over the rate measured so far (None before any work, or no total)."""
    info = bar.format_dict
    done, elapsed = info["n"] - info.get("initial", 0), info["elapsed"]
    rate = info.get("rate") or (done / elapsed if elapsed > 0 else None)   # tqdm's smoothed rate, else the mean
    if not rate or info.get("total") is None:
        return None
    return (info["total"] - info["n"]) / rate
