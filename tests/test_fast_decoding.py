"""The decoding door's process-wide settings (lumen.fast.decoding): the garbage collector leaves the objects of
before out of its rounds while tokens come, and freed large buffers go back to the system."""

from __future__ import annotations

import gc
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from lumen import GPT, fast


def test_the_objects_of_before_sit_out_the_collectors_rounds_while_tokens_come():
    torch.manual_seed(0)
    model = GPT.from_preset("baby-llama", d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, context=32).eval()
    before = gc.get_freeze_count()
    with fast.decoding(model) as decoder:
        tokens = decoder.stream(torch.tensor([[1, 2, 3]]), 4)
        next(tokens)
        assert gc.get_freeze_count() > before + 1000  # (torch and lumen alone are many thousand objects)
        list(tokens)
    assert gc.get_freeze_count() == before


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_large_buffers_go_back_to_the_system():
    """A 24 MiB buffer allocated and freed twice: glibc keeps the second in its heap (its threshold rose to
    the first), resident; after `return_large_buffers` neither stays. Each case in a fresh process; counted is
    anonymous memory only (the library code pages a first call maps in are resident either way), after a
    first small tensor (torch's one-time setup, its thread pool)."""
    child = textwrap.dedent("""
        import importlib, sys, torch
        if sys.argv[1] == "returned":  # (the module, not the door of the same name)
            importlib.import_module("lumen.fast.decoding").return_large_buffers()
        def resident():
            return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon:")).split()[1]) // 1024
        torch.ones(2**16).add_(1)  # (big enough to start the thread pool, small enough for the heap)
        start = resident()
        for _ in range(2):
            buffer = torch.ones(6 * 2**20)  # 24 MiB (glibc raises its threshold up to 32 MiB), every page touched
            del buffer
        print(resident() - start)
    """)
    kept = {case: int(subprocess.run([sys.executable, "-c", child, case], capture_output=True, text=True,
                                     check=True).stdout.split()[-1]) for case in ("kept", "returned")}
    assert kept["kept"] - kept["returned"] >= 20 and kept["returned"] < 12, kept
