"""lumen.fast.attention: a decoding step's one query, its group sharing each key head, gives the chapter's
attention (and PyTorch's fused kernel) to float32 rounding, and the door puts the chapter's class back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lumen import fast
from lumen.attention import KVCache, MultiHeadAttention
from lumen.decode import GREEDY, stream
from lumen.fast.attention import OneQueryAttention, one_query_attention, plain_attention
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
    assert one_query_attention(model) == model.cfg.n_layers
    cache = KVCache(model.cfg, 1, 32)
    model(ids, cache=cache)
    for t in range(20):
        torch.testing.assert_close(model(torch.tensor([[t + 3]]), cache=cache)[0], plain_logits[t],
                                   rtol=1e-5, atol=1e-5)
    assert plain_attention(model) == model.cfg.n_layers
    assert all(type(b.attn) is MultiHeadAttention for b in model.blocks)


def test_the_door_swaps_it_in_and_out_and_keeps_the_tokens():
    model = gqa_model(2)
    ids = torch.randint(0, 65, (1, 4))
    want = torch.stack(list(stream(model, ids, 24, GREEDY)))
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
