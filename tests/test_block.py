"""The chapter's block, held to the chapter's own numbers and to torch.nn's reference modules."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lumen import GPT, MLP, LayerNorm, ModelConfig, PostLNBlock, RMSNorm, SwiGLU, TransformerBlock
from lumen.block import ACTIVATIONS


def test_gelu_values_from_the_worked_example():
    x = torch.tensor([1.0, -1.0, -2.0, 0.0])
    assert F.gelu(x).tolist() == pytest.approx([0.84, -0.16, -0.05, 0.0], abs=0.005)
    # GELU(x) = x * Phi(x): the same numbers from the normal CDF written another way
    phi = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    torch.testing.assert_close(ACTIVATIONS["gelu"](x), x * phi)


def test_worked_mlp_example():
    """d = 2, hidden 4, x = [1, -1]. The chapter states the pre-activations [1, -1, -2, 0], the hidden
    activation [0.84, -0.16, -0.05, 0] and the result x + write = [1.79, -1.21]; W1 and W2 below are
    matrices consistent with those statements (the chapter's own are not in the text)."""
    mlp = MLP(2, 4, activation="gelu")
    W1 = torch.tensor([[1.0, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])  # columns are the "key" patterns
    W2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])  # rows are the written "values"
    with torch.no_grad():
        mlp.fc.weight.copy_(W1.t()), mlp.fc.bias.zero_()
        mlp.proj.weight.copy_(W2.t()), mlp.proj.bias.zero_()
    x = torch.tensor([1.0, -1.0])
    assert mlp.fc(x).tolist() == [1.0, -1.0, -2.0, 0.0]
    h = mlp.act(mlp.fc(x))
    assert h.tolist() == pytest.approx([0.84, -0.16, -0.05, 0.0], abs=0.005)
    assert h[3] == 0.0  # unit 4 is exactly off
    assert (x + mlp(x)).tolist() == pytest.approx([1.79, -1.21], abs=0.01)


def test_gelu_minimum():
    x = torch.linspace(-3, 0, 30001, dtype=torch.float64)
    y = F.gelu(x)
    assert y.min().item() == pytest.approx(-0.17, abs=0.005)
    assert x[y.argmin()].item() == pytest.approx(-0.75, abs=0.01)


def test_rmsnorm_worked_example():
    out = RMSNorm(4)(torch.tensor([2.0, 4.0, 6.0, 8.0]))
    assert out.tolist() == pytest.approx([0.37, 0.73, 1.10, 1.46], abs=0.005)
    assert math.sqrt(30) == pytest.approx(5.48, abs=0.005)


shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 33))


@settings(max_examples=40, deadline=None)
@given(shape=shapes, eps=st.sampled_from([1e-5, 1e-6, 1e-3]), seed=st.integers(0, 2**16), scale=st.floats(0.01, 100))
def test_layernorm_matches_torch(shape, eps, seed, scale):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    ours, ref = LayerNorm(d, eps).double(), nn.LayerNorm(d, eps=eps).double()
    with torch.no_grad():
        w, b = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
        ours.g.copy_(w), ours.b.copy_(b), ref.weight.copy_(w), ref.bias.copy_(b)
    torch.testing.assert_close(ours(x), ref(x))


@settings(max_examples=40, deadline=None)
@given(shape=shapes, eps=st.sampled_from([1e-5, 1e-6, 1e-3]), seed=st.integers(0, 2**16), scale=st.floats(0.01, 100))
def test_rmsnorm_matches_torch(shape, eps, seed, scale):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    ours, ref = RMSNorm(d, eps).double(), nn.RMSNorm(d, eps=eps).double()
    with torch.no_grad():
        w = torch.randn(d, generator=g, dtype=torch.float64)
        ours.g.copy_(w), ref.weight.copy_(w)
    torch.testing.assert_close(ours(x), ref(x))


def test_swiglu_is_the_gated_formula():
    torch.manual_seed(0)
    m = SwiGLU(8, 12)
    x = torch.randn(3, 8)
    gate, up = x @ m.w_gate.weight.t(), x @ m.w_up.weight.t()
    expected = (gate * torch.sigmoid(gate) * up) @ m.w_down.weight.t()  # SiLU(g) = g * sigmoid(g)
    torch.testing.assert_close(m(x), expected)
    assert all(lin.bias is None for lin in (m.w_gate, m.w_up, m.w_down))


def test_chapter_block_names_and_defaults():
    block = TransformerBlock(64, 4)
    names = {n for n, _ in block.named_parameters()}
    assert {"ln1.g", "ln1.b", "ln2.g", "ln2.b", "attn.out.weight", "mlp.fc.weight", "mlp.proj.weight"} <= names
    assert block.mlp.fc.out_features == 4 * 64  # d_ff defaults to 4 d
    assert block.drop.p == 0.0 and block.mlp.drop.p == 0.0  # dropout defaults to 0
    assert block.mlp.act is F.gelu and block.ln1.eps == 1e-5


def test_block_forward_is_the_two_residual_updates():
    torch.manual_seed(0)
    block = TransformerBlock(32, 4).eval()
    x = torch.randn(2, 7, 32)
    mid = x + block.attn(block.ln1(x))
    torch.testing.assert_close(block(x), mid + block.mlp(block.ln2(mid)))


def test_post_ln_block_normalises_the_stream():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, norm_placement="post")
    block = TransformerBlock.from_config(cfg).eval()
    assert isinstance(block, PostLNBlock)
    x = torch.randn(2, 7, 32) * 5
    mid = block.ln1(x + block.attn(x))
    out = block(x)
    torch.testing.assert_close(out, block.ln2(mid + block.mlp(mid)))
    # the stream itself now has zero mean and unit variance per token (before gain and bias)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 7), atol=1e-5, rtol=0)


def test_init_rule_std_per_parameter():
    torch.manual_seed(0)
    n_layers = 8
    for mlp in ("mlp", "swiglu"):
        cfg = ModelConfig(vocab_size=512, context=64, d_model=256, n_layers=n_layers, n_heads=4, mlp=mlp,
                          activation="silu" if mlp == "swiglu" else "gelu")
        model = GPT(cfg)
        small = 0.02 / math.sqrt(2 * n_layers)
        # the matrices that write into the stream: W_O and the MLP's W2, named as the chapter names them
        writes = {id(b.attn.out.weight) for b in model.blocks}
        writes |= {id(b.mlp.w_down.weight if mlp == "swiglu" else b.mlp.proj.weight) for b in model.blocks}
        for name, p in model.named_parameters():
            if name.endswith(".g"):
                assert torch.all(p == 1), name
                continue
            if id(p) in writes:
                assert p.std().item() == pytest.approx(small, rel=0.05), name
            elif name.endswith(".weight") and p.dim() == 2:
                assert p.std().item() == pytest.approx(0.02, rel=0.05), name
            else:  # biases and norm offsets
                assert torch.all(p == 0), name
            assert abs(p.mean().item()) < 0.002, name


def _stream_variance(residual_rule: bool, n_layers: int = 48) -> list[float]:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, context=64, d_model=128, n_layers=n_layers, n_heads=4, activation="gelu")
    model = GPT(cfg).eval()
    if not residual_rule:
        for block in model.blocks:
            for lin in (block.attn.out, block.mlp.down):
                nn.init.normal_(lin.weight, std=0.02)
    x = model.embed(torch.randint(0, 256, (8, 64)))
    variances = [x.var().item()]
    with torch.no_grad():
        for block in model.blocks:
            x = block(x)
            variances.append(x.var().item())
    return variances


def test_stream_variance_at_init():
    """The chapter: without the rule the 2N writes add ~2N sigma^2 (linear growth); with writes at
    std sigma/sqrt(2N) their sum is ~sigma^2, so the stream grows 2N times less."""
    plain, scaled = _stream_variance(False), _stream_variance(True)
    depth = torch.arange(len(plain), dtype=torch.float64)
    growth = torch.tensor(plain, dtype=torch.float64)
    # linear growth: a straight line explains the per-block variance almost perfectly
    slope, intercept = torch.linalg.lstsq(torch.stack([depth, torch.ones_like(depth)], 1), growth[:, None]).solution
    fit = depth * slope + intercept
    r2 = 1 - ((growth - fit) ** 2).sum() / ((growth - growth.mean()) ** 2).sum()
    assert r2 > 0.98
    added_plain, added_scaled = plain[-1] - plain[0], scaled[-1] - scaled[0]
    assert 96 / 2 < added_plain / added_scaled < 96 * 2  # 2N = 96 writes
    # with the rule the stream ends within a small factor of where it started: about flat
    assert scaled[-1] / scaled[0] < 0.2 * plain[-1] / plain[0]
