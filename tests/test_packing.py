"""lumen.packing: bf16 linear weights packed for oneDNN give the same bits as plain F.linear."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from lumen.model import GPT, plain_attention
from lumen.packing import PackedLinear, can_pack, pack_linears, row_linear

pytestmark = pytest.mark.skipif(
    not can_pack(torch.nn.Linear(2, 2).to(torch.bfloat16)), reason="this PyTorch has no oneDNN packed linear"
)


def bf16_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT.from_preset("baby-llama", d_model=96, n_heads=6, n_kv_heads=2, d_ff=160).to(torch.bfloat16).eval()


def test_packed_logits_and_tokens_are_bit_identical():
    plain, packed = bf16_model(), bf16_model()
    assert pack_linears(packed) == 6 * 7 + 1  # seven linears per block and the unembedding
    assert pack_linears(GPT.from_preset("baby-llama").to(torch.float64)) == 0  # no oneDNN kernel for float64
    x = torch.randint(0, 65, (2, 40))
    with torch.inference_mode():
        assert torch.equal(plain(x)[0], packed(x)[0])
        with plain_attention(plain), plain_attention(packed):
            assert torch.equal(plain(x)[0], packed(x)[0])
        assert torch.equal(plain.generate(x[:1, :5], 20, temperature=0), packed.generate(x[:1, :5], 20, temperature=0))
    assert packed.state_dict().keys() == plain.state_dict().keys()


def test_packed_gpt2_with_biases():
    torch.manual_seed(1)
    plain = GPT.from_preset("baby-gpt", d_model=96, n_heads=6).to(torch.bfloat16).eval()
    packed = copy.deepcopy(plain)
    pack_linears(packed)
    x = torch.randint(0, 65, (2, 33))
    with torch.inference_mode():
        assert torch.equal(plain(x)[0], packed(x)[0])
        assert torch.equal(plain.generate(x[:, :4], 12, temperature=0), packed.generate(x[:, :4], 12, temperature=0))


def test_packed_linear_against_f_linear_on_odd_inputs():
    layer = torch.nn.Linear(48, 80).to(torch.bfloat16)
    pack_linears(layer)
    assert isinstance(layer, PackedLinear)
    x = torch.randn(3, 7, 100, dtype=torch.bfloat16)[..., :48]  # not contiguous
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        assert torch.equal(layer(x[0, 0]), F.linear(x[0, 0], layer.weight, layer.bias))
        assert torch.equal(layer(x.contiguous()), F.linear(x.contiguous(), layer.weight, layer.bias))
        made_here = torch.nn.Linear(48, 16, bias=False).to(torch.bfloat16)  # inference tensors: no version count
        pack_linears(made_here)
        assert torch.equal(made_here(x.contiguous()), F.linear(x.contiguous(), made_here.weight))


def test_weights_changed_in_place_copies_and_training():
    model = bf16_model()
    pack_linears(model)
    x = torch.randint(0, 65, (1, 12))
    with torch.inference_mode():
        before = model(x)[0]
    twin = copy.deepcopy(model)  # the packed tensor has no storage: copies repack on first use
    with torch.inference_mode():
        assert torch.equal(twin(x)[0], before)
    with torch.no_grad():
        model.blocks[0].mlp.w_up.weight.mul_(1.5)
    reference = bf16_model()
    reference.load_state_dict(model.state_dict())
    with torch.inference_mode():
        assert torch.equal(model(x)[0], reference(x)[0])  # repacked after the in-place change
        assert not torch.equal(model(x)[0], before)
    model.blocks[1].attn.out.weight = torch.nn.Parameter(torch.zeros_like(model.blocks[1].attn.out.weight))
    reference.blocks[1].attn.out.weight = torch.nn.Parameter(torch.zeros_like(reference.blocks[1].attn.out.weight))
    with torch.inference_mode():
        assert torch.equal(model(x)[0], reference(x)[0])  # repacked after the weight was replaced
    model.train()
    _, loss = model(x, targets=x)
    loss.backward()  # with gradients the plain path runs
    assert model.blocks[0].attn.q.weight.grad is not None


def test_float32_packing_agrees_with_f_linear_to_rounding(cpp_compiler):
    torch.manual_seed(2)
    plain = GPT.from_preset("baby-llama", d_model=96, n_heads=6, n_kv_heads=2, d_ff=160).eval()
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) == 6 * 7 + 1
    x = torch.randint(0, 65, (2, 40))
    with torch.inference_mode():
        # another summation order: equal to float32 rounding, not bit for bit
        torch.testing.assert_close(packed(x)[0], plain(x)[0], rtol=1e-5, atol=1e-5)
        greedy = plain.generate(x[:1, :5], 20, temperature=0)
        assert torch.equal(packed.generate(x[:1, :5], 20, temperature=0), greedy)
        # compiled: a decoding step computes its one-row products as fused sums, a prefill calls the
        # packed product as one custom operator
        assert torch.equal(packed.generate(x[:1, :5], 20, temperature=0, compile=True), greedy)
        torch.testing.assert_close(packed.compiled()(x)[0], plain(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_product_is_the_linear(cpp_compiler, dtype):
    """row_linear, eager and compiled, against x @ W.T + b computed in float64 from the same values: to
    float32 rounding, then one rounding to the output dtype."""
    torch.manual_seed(3)
    x, w, b = torch.randn(1, 1, 96, dtype=dtype), torch.randn(200, 96, dtype=dtype), torch.randn(200, dtype=dtype)
    exact = F.linear(x.double(), w.double(), b.double())
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2 ** -8, "atol": 1e-2}
    compiled = torch.compile(row_linear, dynamic=False)
    with torch.inference_mode():
        for fn in (row_linear, compiled):
            for bias in (b, None):
                y = fn(x, w, bias)
                assert y.dtype == dtype and y.shape == (1, 1, 200)
                want = exact if bias is not None else exact - b.double()
                torch.testing.assert_close(y.double(), want, **tol)
