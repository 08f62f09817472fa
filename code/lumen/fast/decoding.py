"""The speed wing's door for decoding: lumen.decode's loop, with the model made fast for a while.

    >>> with decoding(model, compile=True) as decoder:        # doctest: +SKIP
    ...     ids = decoder.generate(idx, 64, temperature=0)

Inside `decoding`, and only there, the model's nn.Linear layers are FastLinear ones holding the same
parameters (packing.py): compiled, a one-token step's products become fused loops over the weights; eager,
the weights live in oneDNN's packed layout. A GGUF's blocks that multiply the same row (q, k and v; gate and
up) are multiplied as one stack (quant.py's SharedRow), and a prompt's rows are each rounded to 8 bits as a
decoded token's row is, and multiplied by byte products (quant.py's `rounded_prompts`: llama.cpp's
arithmetic). A single query attends without copying the cache's keys for each query head (attention.py).
Each step's thread count is measured as the tokens come (lumen.runtime.threads: a busy machine is the normal
case). On leaving, the model is the plain model again, the
same parameters, bit for bit. The tokens are chosen exactly as lumen.decode chooses them (the same
`Sampling`, the model's own defaults included); only their speed differs, and the numbers to float32
rounding (a GGUF's prompt: to the rounding of its rows to 8 bits, as its decoded tokens are).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Generator, Iterator

import torch

from ..decode import Sampling, Step, sampling_for
from ..decode import tokens as plain_tokens
from ..errors import UserError
from ..model import GPT
from ..runtime.compiling import check_cpp_compiler
from ..runtime.heap import large_buffers_returned
from ..runtime.threads import tuned
from . import kernels
from .aot import AOTStep
from .attention import one_query_attention
from .changes import Changes
from .options import DECODE_OPTIONS
from .packing import fast_linears, packed
from .quant import rounded_prompts, share_rows

SLOTS = 256  # a compiled step's KV cache is a multiple of this: decoding runs of nearby lengths share one graph


COMPILERS = (False, True, "aot")  # the door's `compile`: none, torch.compile, AOTInductor (aot.py)


class Decoder:
    """Decodes with one model, made fast by `decoding`. `step` runs one forward pass (compiled or not)."""

    def __init__(self, model: GPT, compile: bool | str):
        self.model, self.compile = model, compile
        self.step: Step = model
        if compile == "aot":  # a one-token step compiled ahead of time, loaded from disk (aot.py)
            self.step = AOTStep(model)
        elif compile:
            # shapes are static (one graph per shape): a KV cache keeps every slot and takes positions as a
            # tensor, so a one-token step compiles once; the weights stay inputs of the graph
            self.step = torch.compile(model, dynamic=False, options=DECODE_OPTIONS)

    def tokens(self, idx: torch.Tensor, max_new_tokens: int, sampling: Sampling | None = None,
               generator: torch.Generator | None = None) -> Generator[torch.Tensor, None, None]:
        """lumen.decode.tokens's tokens (B,) one step at a time, through this decoder's step, with the
        thread count tuned as they come."""
        slots = -(-(idx.size(1) + max_new_tokens) // SLOTS) * SLOTS if self.compile else None
        return tuned(frozen(plain_tokens(self.model, idx, max_new_tokens, sampling, generator, step=self.step,
                                         cache_slots=slots)))

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """As lumen.decode.generate: idx followed by max_new_tokens tokens, (B, T + max_new_tokens)."""
        sampling = sampling_for(self.model, temperature=temperature, top_k=top_k, top_p=top_p)
        new = list(self.tokens(idx, max_new_tokens, sampling, generator))
        return torch.cat([idx] + [t[:, None] for t in new], dim=1)


def frozen(steps: Iterator[torch.Tensor]) -> Generator[torch.Tensor, None, None]:
    """steps, with every Python object that exists when they start left out of the garbage collector's
    rounds (gc.freeze) until they end. A step makes a few short-lived objects; with torch and a model
    loaded there are a million long-lived ones, and each full collection that those few trigger walks them all."""
    gc.freeze()
    try:
        yield from steps
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def decoding(model: GPT, compile: bool | str = False) -> Iterator[Decoder]:
    """The model made fast for decoding while inside (see the module docstring); plain again on leaving.
    compile=True compiles the step with torch.compile (the first step compiles: about a minute on two
    cores, cached on disk after; needs a C++ compiler on a CPU). compile="aot": the one-token step compiled
    ahead of time by AOTInductor (aot.py: built once per model shape, a few minutes; later processes only
    load it: no guards, no Python between kernels, no compiler in memory)."""
    if compile not in COMPILERS:
        raise UserError(f"compile must be one of {', '.join(map(repr, COMPILERS))}, got {compile!r}")
    if compile == "aot" and model.device.type != "cpu":
        raise UserError(f"compile='aot' builds a CPU decoding step; the model is on {model.device}: use compile=True")
    if compile is True and model.device.type == "cpu":
        check_cpp_compiler("decode without compiling")
    with Changes() as changes:  # every change below undone on leaving, an exception inside included
        if model.device.type == "cpu":
            changes.enter_context(large_buffers_returned())
            if compile:
                kernels.load()  # the wing's C++ library: a compiled step's attention reads only the slots it sees
        fast_linears(model, changes)
        share_rows(model, changes)
        rounded_prompts(model, changes)
        one_query_attention(model, changes)
        if not compile:
            changes.enter_context(packed(model))  # eager: oneDNN's layout
        yield Decoder(model, compile)


def tokens(model: GPT, idx: torch.Tensor, max_new_tokens: int, sampling: Sampling | None = None,
           generator: torch.Generator | None = None, compile: bool | str = False) -> Iterator[torch.Tensor]:
    """lumen.decode.tokens, fast: the tokens (B,) one step at a time (see `decoding`)."""
    with decoding(model, compile) as decoder:
        yield from decoder.tokens(idx, max_new_tokens, sampling, generator)


def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             compile: bool | str = False) -> torch.Tensor:
    """lumen.decode.generate, fast (see `decoding`): (B, T + max_new_tokens)."""
    with decoding(model, compile) as decoder:
        return decoder.generate(idx, max_new_tokens, temperature, top_k, top_p, generator)
