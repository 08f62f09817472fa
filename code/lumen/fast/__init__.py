"""lumen's speed wing, behind one door: decoding faster than the readable path, with the same tokens.

What a learner reads (config, block, attention, model, decode) is what runs when a model is loaded and
looked inside. What makes decoding fast lives here, and runs only when asked for:

    >>> from lumen import fast
    >>> ids = fast.generate(model, idx, 64, temperature=0, compile=True)     # doctest: +SKIP
    >>> with fast.decoding(model) as decoder:        # the model made fast for a while     # doctest: +SKIP
    ...     for token in decoder.tokens(idx, 64): ...
    >>> loaded = fast.load_quantized("smollm2")         # decode from a GGUF's own quantized blocks  # doctest: +SKIP

- decoding.py: the door: `decoding(model, compile)`, `tokens`, `generate` (lumen generate, bench/ and
  Python callers all go through it: the same speed and the same sampling defaults everywhere); every change
  it makes is recorded in a Changes (changes.py) and undone on leaving;
- packing.py: FastLinear (one-row products compiled into fused loops; weights in oneDNN's packed layout for
  eager decoding; a float32 prompt through oneDNN), swapped in and out by the door;
- attention.py: OneQueryAttention, a decoding step's one query sharing its group's key head;
- aot.py: `compile="aot"`, the one-token step compiled ahead of time (AOTInductor); options.py: what inductor
  is told for a decoding step;
- loading.py, quant.py, quads.py: a GGUF's Q4_1/Q8_0 matrices kept as the file's blocks (`load_quantized`; the
  QuantLinear and QuantEmbedding layers; their bytes in quads, the order a decoded token reads them);
- kernels.py: the C++ library (quant.cpp's one-row products, multiplying as llama.cpp does; attend.cpp's
  attention of one query) built once per machine, and every op the wing gives torch.

Each is tested to agree with the plain path (tests/test_packing.py, test_fast_attention.py, test_quant.py,
test_aot.py, test_generate.py).
"""

import warnings
from typing import Any

from .decoding import Decoder, decoding, generate, tokens
from .loading import load_quantized
from .quant import QuantEmbedding, QuantLinear

__all__ = ["Decoder", "QuantEmbedding", "QuantLinear", "decoding", "generate", "load_quantized", "tokens"]

# the old names, for one release: "block" is a transformer block, "stream" the residual stream
_RENAMED = {"load_blocks": "load_quantized", "stream": "tokens"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        warnings.warn(f"lumen.fast.{name} is now lumen.fast.{_RENAMED[name]}", DeprecationWarning, stacklevel=2)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module 'lumen.fast' has no attribute {name!r}")
