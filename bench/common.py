"""What several benches share: the repository's root, a median timer, and the tests' helpers (the random-weight
Hugging Face families and the GGUF writer) for a bench that checks what the tests check. The machine line a
bench prints is the library's (lumen.runtime.cpu.machine); the records docs/speed.md renders are results.py's.

    from common import timed             # a bench's own folder is on sys.path when it runs as a script
    seconds, out = timed(lambda: model(ids), repeats=3)
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """The median wall time of `repeats` calls of fn (seconds) and what its last call returned."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def tests_helpers() -> None:
    """Make tests/helpers importable as `helpers` (as the tests import it): one builder of each test model."""
    folder = str(REPO / "tests")
    if folder not in sys.path:
        sys.path.insert(0, folder)
