"""The decoding door's process-wide settings (lumen.fast.decoding): the garbage collector leaves the objects of
before out of its rounds while tokens come (the heap's setting for decoding: tests/test_heap.py)."""

from __future__ import annotations

import gc

import torch

from lumen import GPT, fast


def test_the_objects_of_before_sit_out_the_collectors_rounds_while_tokens_come():
    torch.manual_seed(0)
    model = GPT.from_preset("baby-llama", d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, context=32).eval()
    before = gc.get_freeze_count()
    with fast.decoding(model) as decoder:
        tokens = decoder.tokens(torch.tensor([[1, 2, 3]]), 4)
        next(tokens)
        assert gc.get_freeze_count() > before + 1000  # (torch and lumen alone are many thousand objects)
        list(tokens)
    assert gc.get_freeze_count() == before
