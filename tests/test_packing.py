"""lumen.fast.packing: FastLinear layers and weights packed for oneDNN give the numbers of plain F.linear, with one
copy of the weights: packed, the plain tensor is gone, and state_dict/export still see the plain weights."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from lumen import fast as wing
from lumen.fast.changes import Changes
from lumen.fast.packing import FastLinear, can_pack, fast_linears, packed, row_linear
from lumen.model import GPT, plain_attention

pytestmark = pytest.mark.skipif(not can_pack(torch.nn.Linear(2, 2)), reason="this PyTorch has no oneDNN packed linear")
# oneDNN's bf16 kernels raise on a CPU without them (an AVX2-only one): those tests need them, and say so
needs_onednn_bf16 = pytest.mark.skipif(
    not can_pack(torch.nn.Linear(2, 2).to(torch.bfloat16)),
    reason="oneDNN's bf16 kernels need a CPU with avx512bw, avx512vl and avx512dq, or avx_ne_convert")
# an AMD EPYC Zen 1's flags (AVX2 and FMA, no AVX-512): where the issue's bf16 decoding crashed
ZEN1 = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt aes avx avx2 fma f16c bmi1 bmi2 sha_ni adx"


def bf16_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT.from_preset("baby-llama", d_model=96, n_heads=6, n_kv_heads=2, d_ff=160).to(torch.bfloat16).eval()


@needs_onednn_bf16
def test_packed_logits_and_tokens_are_bit_identical():
    plain, fast = bf16_model(), bf16_model()
    before = {k: v.clone() for k, v in fast.state_dict().items()}
    assert fast_linears(fast) == 6 * 7 + 1  # seven linears per block and the unembedding
    assert fast.lm_head.weight is fast.tok_emb.weight  # ties survive the replacement
    x = torch.randint(0, 65, (2, 40))
    with torch.inference_mode(), packed(fast) as n:
        assert n == 6 * 7  # the tied unembedding stays plain: the embedding reads it
        assert all(m.weight.numel() == 0 for m in fast.modules() if isinstance(m, FastLinear) and m._packed is not None)
        assert torch.equal(plain(x)[0], fast(x)[0])
        with plain_attention(plain), plain_attention(fast):
            assert torch.equal(plain(x)[0], fast(x)[0])
        assert torch.equal(plain.generate(x[:1, :5], 20, temperature=0), fast.generate(x[:1, :5], 20, temperature=0))
        inside = fast.state_dict()  # derived from the packed layout
    assert inside.keys() == before.keys() and all(torch.equal(inside[k], before[k]) for k in before)
    after = fast.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)  # unpacked bit for bit
    with packed(GPT.from_preset("baby-llama").to(torch.float64)) as n:
        assert n == 0  # no oneDNN kernel for float64


@needs_onednn_bf16
def test_packed_gpt2_with_biases():
    torch.manual_seed(1)
    plain = GPT.from_preset("baby-gpt", d_model=96, n_heads=6).to(torch.bfloat16).eval()
    fast = copy.deepcopy(plain)
    fast_linears(fast)
    x = torch.randint(0, 65, (2, 33))
    with torch.inference_mode(), packed(fast):
        assert torch.equal(plain(x)[0], fast(x)[0])
        assert torch.equal(plain.generate(x[:, :4], 12, temperature=0), fast.generate(x[:, :4], 12, temperature=0))


@needs_onednn_bf16
def test_packed_linear_against_f_linear_on_odd_inputs():
    torch.manual_seed(4)
    layer = torch.nn.Linear(48, 80).to(torch.bfloat16)
    w, b = layer.weight.detach().clone(), layer.bias.detach().clone()
    holder = torch.nn.Sequential(layer)
    x = torch.randn(3, 7, 100, dtype=torch.bfloat16)[..., :48]  # not contiguous
    with Changes() as changes:
        assert fast_linears(holder, changes) == 1 and isinstance(holder[0], FastLinear)
        with torch.inference_mode(), packed(holder):
            assert torch.equal(holder(x), F.linear(x, w, b))
            assert torch.equal(holder(x[0, 0]), F.linear(x[0, 0], w, b))
            assert torch.equal(holder(x.contiguous()), F.linear(x.contiguous(), w, b))
    assert holder[0] is layer and type(layer) is torch.nn.Linear and torch.equal(layer.weight, w)


def test_export_inside_packed_gives_the_same_tensors(tmp_path):
    """A Hugging Face directory written while the weights are packed holds the plain weights exactly."""
    pytest.importorskip("safetensors")
    from lumen.formats import load
    from lumen.formats.hf import save_hf_dir

    model = bf16_model(5).float()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    fast_linears(model)
    with packed(model):
        save_hf_dir(model, tmp_path / "hf")
    back = load(tmp_path / "hf").model
    got = back.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_training_after_fast_linears():
    model = bf16_model().float()
    fast_linears(model)
    model.train()
    x = torch.randint(0, 65, (1, 12))
    _, loss = model(x, targets=x)
    loss.backward()  # with gradients the plain path runs
    assert model.blocks[0].attn.q.weight.grad is not None


def test_float32_packing_agrees_with_f_linear_to_rounding(cpp_compiler):
    torch.manual_seed(2)
    plain = GPT.from_preset("baby-llama", d_model=96, n_heads=6, n_kv_heads=2, d_ff=160).eval()
    fast = copy.deepcopy(plain)
    assert fast_linears(fast) == 6 * 7 + 1
    x = torch.randint(0, 65, (2, 40))
    with torch.inference_mode():
        greedy, logits = plain.generate(x[:1, :5], 20, temperature=0), plain(x)[0]
        with packed(fast):
            # another summation order: equal to float32 rounding, not bit for bit
            torch.testing.assert_close(fast(x)[0], plain(x)[0], rtol=1e-5, atol=1e-5)
            assert torch.equal(fast.generate(x[:1, :5], 20, temperature=0), greedy)
    # compiled (the door swaps the FastLinear layers in itself): one-row products as fused sums
    with wing.decoding(plain, compile=True) as decoder, torch.inference_mode():
        assert all(type(m) is not torch.nn.Linear for m in plain.modules())
        assert torch.equal(decoder.generate(x[:1, :5], 20, temperature=0), greedy)
        torch.testing.assert_close(decoder.step(x)[0], logits, rtol=1e-5, atol=1e-5)
    assert not any(isinstance(m, FastLinear) for m in plain.modules())  # plain again on leaving


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


def test_many_rows_in_float32_go_through_onednn(cpp_compiler, monkeypatch):
    """A float32 prompt's products (eager and compiled) are oneDNN's on the plain weight: x @ W.T + b computed
    in float64 to float32 rounding; with gradients or under autocast they stay F.linear's."""
    from lumen.fast import kernels

    torch.manual_seed(4)
    layer = FastLinear.from_linear(torch.nn.Linear(96, 200))
    x = torch.randn(3, 7, 96)
    exact = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    calls = []
    real = kernels.onednn_linear
    monkeypatch.setattr(kernels, "onednn_linear", lambda *a: calls.append(1) or real(*a))
    with torch.inference_mode():
        for fn in (layer, torch.compile(layer, dynamic=False)):
            torch.testing.assert_close(fn(x).double(), exact, rtol=1e-5, atol=1e-5)
        assert len(calls) == 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.bfloat16  # autocast's own product
    y = layer(x)  # training: F.linear, with its gradient
    y.sum().backward()
    assert len(calls) == 2 and layer.weight.grad is not None


def test_bf16_decoding_on_an_avx2_only_cpu_takes_the_plain_product(monkeypatch):
    """On a CPU whose flags lack oneDNN's bf16 kernels, the door decodes a bf16 model without packing (where
    oneDNN's reorder would raise, as it did on a Zen 1) and gives the plain path's tokens; a float32 model
    still packs."""
    monkeypatch.setenv("LUMEN_CPU_FLAGS", ZEN1)

    def reorder_raises(self):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or "
                           "avx512bw, avx512vl and avx512dq")

    monkeypatch.setattr(FastLinear, "pack", reorder_raises)  # what oneDNN does on such a CPU
    model = bf16_model(7)
    assert not can_pack(model) and can_pack(torch.nn.Linear(2, 2))
    x = torch.randint(0, 65, (1, 6))
    with torch.inference_mode():
        want = model.generate(x, 16, temperature=0)
        assert torch.equal(wing.generate(model, x, 16, temperature=0), want)
    assert not any(isinstance(m, FastLinear) for m in model.modules())
    monkeypatch.setenv("LUMEN_CPU_FLAGS", ZEN1 + " avx512bw avx512vl avx512dq")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        with pytest.raises(RuntimeError, match="bf16 path needs"):  # the same CPU with them would pack
            wing.generate(model, x, 2, temperature=0)
    else:  # oneDNN itself has no bf16 kernels here (an AVX2-only CPU): flags that claim them do not make it pack
        assert torch.equal(wing.generate(model, x, 16, temperature=0), want)
