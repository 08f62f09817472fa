"""torch.compile as lumen uses it, for training (lumen.train) and for decoding (lumen.fast).

    >>> step = torch.compile(model, options=COMPILE_OPTIONS)       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

# Inductor writes tanh on CPU as a long vector polynomial; as 2 / (1 + e^(-2u)) - 1, the same function to
# float32 rounding, GELU's forward and backward cost far less (docs/speed.md measures it). Other devices ignore it.
COMPILE_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {"cpp.use_decompose_tanh": True}


def check_cpp_compiler(fix: str = "set compile=false") -> None:
    """torch.compile on a CPU writes and builds C++: without a compiler, say so now, in one line."""
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:  # inductor's InvalidCxxCompiler: none of g++, c++, $CXX runs
        raise ConfigError("compiling on a CPU needs a C++ compiler for torch.compile and none was found: "
                          f"install one (apt-get install g++, or set CXX) or {fix}") from e
