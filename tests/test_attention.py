"""Attention: the fused kernel and the readable path agree; the KV cache changes nothing but speed."""

import math

import pytest
import torch
import torch.nn.functional as F

from lumen import GPT, KVCache, ModelConfig, MultiHeadAttention, RoPE
from lumen.attention import visible

SHAPES = [
    dict(n_heads=4),  # plain multi-head, learned positions
    dict(n_heads=4, n_kv_heads=2, positions="rope"),  # grouped-query with RoPE
    dict(n_heads=4, n_kv_heads=1, positions="rope", bias=False),  # multi-query
]


def _attention(**kw):
    cfg = ModelConfig(d_model=32, context=64, **kw)
    return MultiHeadAttention.from_config(cfg).eval()


@pytest.mark.parametrize("kw", SHAPES)
def test_sdpa_equals_plain_path(kw):
    torch.manual_seed(0)
    attn = _attention(**kw)
    x = torch.randn(2, 11, 32)
    fused = attn(x)
    attn.use_sdpa = False
    torch.testing.assert_close(attn(x), fused, atol=1e-6, rtol=1e-5)


def test_plain_path_is_the_formula():
    """softmax(Q K^T / sqrt(d_head)) V with a causal mask, written out head by head."""
    torch.manual_seed(0)
    attn = _attention(n_heads=2)
    attn.use_sdpa = False
    x = torch.randn(1, 5, 32)
    heads = []
    for h in range(2):
        sl = slice(16 * h, 16 * (h + 1))
        q, k, v = (lin(x)[0, :, sl] for lin in (attn.q, attn.k, attn.v))
        scores = q @ k.T / math.sqrt(16)
        scores = scores.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
        heads.append(F.softmax(scores, -1) @ v)
    torch.testing.assert_close(attn(x)[0], attn.out(torch.cat(heads, -1)))


def test_attention_output_is_convex_combination_of_values():
    """The chapter's 'mixing is not thinking': each head's output lies in the hull of the values."""
    torch.manual_seed(0)
    attn = _attention(n_heads=4)
    attn.use_sdpa = False
    seen = {}
    attn.pattern.register_forward_hook(lambda m, i, o: seen.setdefault("a", o))
    attn(torch.randn(2, 9, 32))
    a = seen["a"]
    assert torch.all(a >= 0) and torch.allclose(a.sum(-1), torch.ones(2, 4, 9))
    assert torch.all(a.triu(1) == 0)  # causal: nothing from the future


def test_causality():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, context=32, d_model=32, n_layers=2, n_heads=4)).eval()
    idx = torch.randint(0, 50, (1, 12))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 50
    torch.testing.assert_close(model(idx)[0][:, :8], model(changed)[0][:, :8])


def test_rope_rotates_by_relative_position():
    """q.k after RoPE depends on the distance between positions, not on where they are."""
    rope = RoPE(8, 64, theta=10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    def dot(i, j):
        return (rope(q, i) * rope(k, j)).sum().item()
    assert dot(3, 1) == pytest.approx(dot(13, 11), abs=1e-5)
    assert dot(0, 0) == pytest.approx((q * k).sum().item(), abs=1e-6)
    assert rope(q, 5).norm().item() == pytest.approx(q.norm().item(), rel=1e-6)  # a rotation


@pytest.mark.parametrize("kw", SHAPES)
def test_kv_cache_matches_full_forward(kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=60, context=40, d_model=32, n_layers=2, **kw)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 60, (2, 15))
    full, _ = model(idx)
    cache = KVCache(cfg, 2, 20)
    parts = [model(idx[:, :6], cache=cache)[0], model(idx[:, 6:7], cache=cache)[0], model(idx[:, 7:], cache=cache)[0]]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.n == 15


def test_visible_window():
    # queries at positions 3 and 4 of five cache slots see their own position and those before
    m = visible(torch.tensor([3, 4]), 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert visible(torch.arange(4), 4).equal(torch.ones(4, 4, dtype=torch.bool).tril())


def test_cache_slots_beyond_the_sequence_do_not_matter():
    # a cache larger than needed (unwritten slots hold garbage) gives the same logits
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, context=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, positions="rope")
    model = GPT(cfg).eval()
    idx = torch.randint(0, 50, (1, 9))
    full, _ = model(idx)
    cache = KVCache(cfg, 1, 64)
    for layer in cache.layers:
        layer.k.normal_(), layer.v.normal_()
    parts = [model(idx[:, :4], cache=cache)[0]] + [model(idx[:, i : i + 1], cache=cache)[0] for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_kv_cache_full_is_an_error():
    cfg = ModelConfig(vocab_size=10, context=16, d_model=16, n_layers=1, n_heads=2)
    model = GPT(cfg).eval()
    cache = KVCache(cfg, 1, 4)
    with pytest.raises(ValueError, match="KV cache full"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
