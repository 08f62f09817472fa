"""lumen.fast.attention: a decoding step's one query, its group sharing each key head, gives the chapter's
attention (and PyTorch's fused kernel) to float32 rounding, and the door puts the chapter's class back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lumen import fast
from lumen.attention import KVCache, MultiHeadAttention
from lumen.decode import GREEDY, tokens
from lumen.fast.attention import OneQueryAttention, one_query_attention
from lumen.fast.changes import Changes
from lumen.model import GPT


def gqa_model(seed: int = 0, **changes: object) -> GPT:
    torch.manual_seed(seed)
    return GPT.from_preset("baby-llama", d_model=96, n_heads=6, n_kv_heads=2, d_ff=160, context=64, **changes).eval()


@pytest.mark.parametrize("kv_heads", [1, 2, 6])
def test_one_query_against_the_plain_path_and_the_fused_kernel(kv_heads):
    torch.manual_seed(kv_heads)
    attn = MultiHeadAttention(96, 6, kv_heads, bias=False).eval()
    q, k, v = torch.randn(1, 6, 1, 16), torch.randn(1, kv_heads, 40, 16), torch.randn(1, kv_heads, 40, 16)
    allowed = torch.arange(40)[None] <= 25  # (1 query, 40 slots): the cache's first 26 held
    plain = attn.attend_plain(q, k, v, allowed)
    one_query_attention(attn)
    assert type(attn) is OneQueryAttention
    ours = attn.attend_plain(q, k, v, allowed)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=kv_heads != 6)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours, fused, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("batch", "kv_heads", "hd"), [(1, 3, 64), (1, 2, 128), (2, 1, 16), (2, 6, 8)])
def test_the_kernel_reads_only_the_allowed_slots_as_the_plain_path_does(batch, kv_heads, hd, cpp_compiler,
                                                                       monkeypatch):
    """attend.cpp (one query over the slots it may see): the chapter's attention to float32 rounding, for a
    cache's first slots, a sliding window's slots in the middle, a single slot, and a long run of slots (read
    in two halves, joined after: the same bits on one thread as on two); and the one-query class takes it
    where the kernels are loaded, and the fused sums where they are not."""
    from lumen.fast import kernels

    if not kernels.load():
        pytest.skip("the speed wing's kernels do not build here (x86-64 with AVX2, g++ and ninja)")
    torch.manual_seed(hd)
    attn = MultiHeadAttention(6 * hd, 6, kv_heads, bias=False).eval()
    q = torch.randn(batch, 6, 1, hd)
    k, v = torch.randn(batch, kv_heads, 160, hd), torch.randn(batch, kv_heads, 160, hd)
    slot = torch.arange(160)[None]
    masks = {"first": slot <= 30, "window": (slot <= 30) & (slot > 22), "one": slot == 0,
             "long": (slot <= 140) & (slot > 10)}
    threads = torch.get_num_threads()
    for name, allowed in masks.items():
        plain = attn.attend_plain(q, k, v, allowed)
        got = torch.ops.lumen.attend_one(q, k, v, allowed)
        torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6, msg=name)
        torch.set_num_threads(3 - min(threads, 2))  # the other of one and two threads
        try:
            assert torch.equal(torch.ops.lumen.attend_one(q, k, v, allowed), got), name
        finally:
            torch.set_num_threads(threads)
        with Changes() as changes:
            one_query_attention(attn, changes)
            for loaded in (True, False):
                monkeypatch.setattr(kernels, "_library", loaded)
                torch.testing.assert_close(attn.attend_plain(q, k, v, allowed), plain, rtol=1e-5, atol=1e-6,
                                           msg=name)
    monkeypatch.undo()
    q[0, 0, 0, 0] = 1e4  # a loud query: the softmax subtracts its largest score first, as torch's does
    allowed = masks["first"]
    torch.testing.assert_close(torch.ops.lumen.attend_one(q, k, v, allowed), attn.attend_plain(q, k, v, allowed),
                               rtol=1e-5, atol=1e-5)


def test_a_prompt_or_an_extra_mask_takes_the_chapters_path():
    attn = MultiHeadAttention(96, 6, 2, bias=False).eval()
    q, k, v = torch.randn(1, 6, 3, 16), torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    plain = attn.attend_plain(q, k, v, None)
    one_query_attention(attn)
    assert torch.equal(attn.attend_plain(q, k, v, None), plain)  # many queries: the same code, the same bits


@torch.inference_mode()
def test_decoding_steps_with_the_cache_agree_with_the_plain_model():
    model = gqa_model(1, sliding_window=8)
    ids = torch.randint(0, 65, (1, 5))
    plain_logits = []
    cache = KVCache(model.cfg, 1, 32)
    model(ids, cache=cache)
    for t in range(20):
        plain_logits.append(model(torch.tensor([[t + 3]]), cache=cache)[0])
    with Changes() as changes:
        assert one_query_attention(model, changes) == model.cfg.n_layers
        cache = KVCache(model.cfg, 1, 32)
        model(ids, cache=cache)
        for t in range(20):
            torch.testing.assert_close(model(torch.tensor([[t + 3]]), cache=cache)[0], plain_logits[t],
                                       rtol=1e-5, atol=1e-5)
    assert all(type(b.attn) is MultiHeadAttention for b in model.blocks)


def test_the_door_swaps_it_in_and_out_and_keeps_the_tokens():
    model = gqa_model(2)
    ids = torch.randint(0, 65, (1, 4))
    want = torch.stack(list(tokens(model, ids, 24, GREEDY)))
    with fast.decoding(model) as decoder:
        assert all(type(b.attn) is OneQueryAttention for b in model.blocks)
        got = decoder.generate(ids, 24, temperature=0)[0, 4:]
    assert torch.equal(got, want[:, 0])
    assert all(type(b.attn) is MultiHeadAttention for b in model.blocks)


@pytest.mark.slow
def test_the_compiled_step_agrees_with_the_plain_model():
    model = gqa_model(3)
    ids = torch.randint(0, 65, (1, 6))
    want = model.generate(ids, 30, temperature=0)
    assert torch.equal(fast.generate(model, ids, 30, temperature=0, compile=True), want)


@pytest.mark.slow
@pytest.mark.parametrize("build", ["x86-64-v3", "native", "arm64"])
def test_the_kernels_arithmetic_without_torch_on_each_instruction_set(build, tmp_path):
    """attend.h (attend.cpp's arithmetic, no torch) built for x86-64 and for ARM64's NEON (run under emulation):
    one query head group's attention over n slots is softmax attention computed in float64, to float32
    rounding; n past and short of the vector widths (the scores' tail), hd not a multiple of 16."""
    import struct
    import subprocess

    from helpers.cross import check_program

    command = check_program("attend_check.cpp", build, tmp_path)
    for group, hd, n in ((3, 64, 37), (1, 8, 5), (2, 24, 130)):
        g = torch.Generator().manual_seed(n)
        q, k, v = torch.randn(group, hd, generator=g), torch.randn(n, hd, generator=g), torch.randn(n, hd, generator=g)
        problem = tmp_path / "problem"
        problem.write_bytes(struct.pack("<3q", group, hd, n) + b"".join(t.numpy().tobytes() for t in (q, k, v)))
        subprocess.run([*command, str(problem), str(tmp_path / "y")], check=True, timeout=120)
        y = torch.from_numpy(np.fromfile(tmp_path / "y", dtype=np.float32)).reshape(group, hd)
        want = torch.softmax(q.double() @ k.double().T / hd ** 0.5, -1) @ v.double()
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
