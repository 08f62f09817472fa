"""What several benches share: the repository's root, a median timer, and the tests' helpers (the random-weight
Hugging Face families and the GGUF writer) for a bench that checks what the tests check. The machine line a
bench prints is the library's (lumen.runtime.cpu.machine); the records docs/speed.md renders are results.py's.

    from common import timed             # a bench's own folder is on sys.path when it runs as a script
    seconds, out = timed(lambda: model(ids), repeats=3)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent

# A process that runs as an AVX2-only x86-64 CPU (an AMD Zen 1's flags) would, on any x86-64 machine (the
# Makefile's AVX2_ONLY, which `make test-avx2` runs under): lumen deciding by those flags and building its kernels
# for them, torch's own kernels held to AVX2 (ATen's, oneDNN's, MKL's, and the code torch.compile writes, cached
# apart: its cache keys do not hold the instruction set). The memory, caches and clock stay this machine's.
AVX2_STAND_IN = {"LUMEN_CPU_FLAGS": "avx avx2 fma f16c", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                 "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                 "TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / "lumen-inductor-avx2")}

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
