"""Where lumen keeps what it makes once and reuses: PyPI downloads (fetch.py), tokenized corpora (data.py),
the speed wing's built kernels and exported decoding steps, the benches' native builds.

    >>> cache_dir("kernels")                     # doctest: +SKIP
    PosixPath('/root/.cache/lumen/kernels')

$LUMEN_CACHE where set, else $XDG_CACHE_HOME/lumen, else ~/.cache/lumen; read from the environment at each call,
so a test (or a bench) that sets LUMEN_CACHE gets a cache of its own. Hugging Face's own cache is Hugging
Face's (lumen.formats.hf.hub_cache_dir).
"""

from __future__ import annotations

import os
from pathlib import Path

VARIABLE = "LUMEN_CACHE"


def cache_dir(*parts: str) -> Path:
    """lumen's cache folder, or a path inside it (`cache_dir("data")`); nothing is created."""
    root = os.environ.get(VARIABLE) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lumen"
    return Path(root, *parts)
