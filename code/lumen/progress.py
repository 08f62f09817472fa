"""Progress bars for jobs that take more than a few seconds: tqdm on stderr, silent when stderr is not a
terminal (piped, redirected, a test) or inside `quiet()` (the CLI's --quiet).

    >>> for k in progress(range(n_layers), desc="deleting blocks", unit="block"):   # doctest: +SKIP
    ...     ...
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator

from tqdm import tqdm

_quiet = False


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No progress bars inside this block (when `on`)."""
    global _quiet
    before, _quiet = _quiet, _quiet or on
    try:
        yield
    finally:
        _quiet = before


def progress(iterable: Iterable | None = None, total: int | None = None, desc: str | None = None,
             unit: str = "it") -> tqdm:
    """A tqdm bar on stderr that draws only on a terminal and outside `quiet()`; when silent it still
    iterates and accepts update()/set_postfix(), so callers never branch on it. The bar is removed when done."""
    # disable=None is tqdm's "off unless the stream is a terminal"
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False,
                disable=True if _quiet else None)
