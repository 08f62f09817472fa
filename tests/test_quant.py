"""lumen.quant: products computed from a GGUF's Q4_1/Q8_0 blocks against the gguf package's own dequantized
matrices, and the real SmolLM2 decoded from its blocks against the dequantized float32 model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

from lumen.quant import QuantEmbedding, QuantLinear, blocks_from_gguf  # noqa: E402

TYPES = [Q.Q4_1, Q.Q8_0]


def quantized_tensor(qtype, out: int = 96, n: int = 160, seed: int = 0):
    """(a GGUF-like tensor of random weights in qtype, the gguf package's float32 dequantization of it)."""
    w = np.random.default_rng(seed).standard_normal((out, n)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    reference = quants.dequantize(raw, qtype).astype(np.float32).reshape(out, n)
    return SimpleNamespace(data=raw, tensor_type=qtype), torch.from_numpy(reference)


@pytest.mark.parametrize("qtype", TYPES)
def test_blocks_dequantize_as_the_gguf_package_does(qtype):
    tensor, reference = quantized_tensor(qtype)
    blocks = blocks_from_gguf(tensor)
    assert torch.equal(blocks.dequantized(), reference)  # w = d q (+ m), the same float32 operations
    assert blocks.codes.dtype == (torch.uint8 if qtype == Q.Q4_1 else torch.int8)
    if qtype == Q.Q4_1:
        assert int(blocks.codes.max()) <= 15  # 4-bit codes, one to a byte


@pytest.mark.parametrize("qtype", TYPES)
def test_quantized_products_equal_the_dequantized_reference(qtype, cpp_compiler):
    """One row (from the blocks, eager and compiled) and many rows, against F.linear in float64 on the
    gguf package's dequantized weight: float32 rounding only."""
    tensor, reference = quantized_tensor(qtype, seed=1)
    layer = QuantLinear(blocks_from_gguf(tensor))
    torch.manual_seed(1)
    x = torch.randn(3, 5, 160)
    want = F.linear(x.double(), reference.double())
    compiled = torch.compile(layer, dynamic=False)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x).double(), want, rtol=1e-5, atol=1e-4)
        for fn in (layer, compiled):
            y = fn(x[:1, :1])
            assert y.shape == (1, 1, 96) and y.dtype == torch.float32
            torch.testing.assert_close(y.double(), want[:1, :1], rtol=1e-5, atol=1e-4)


def test_products_by_slabs_of_rows(monkeypatch):
    """Eagerly (and for many rows) the weight is dequantized a slab of rows at a time: uneven slabs give
    the same product as the whole matrix."""
    from lumen import quant

    tensor, reference = quantized_tensor(Q.Q4_1, out=100, seed=3)
    layer = QuantLinear(blocks_from_gguf(tensor))
    x = torch.randn(2, 4, 160)
    whole = layer(x)
    monkeypatch.setattr(quant, "SLAB", 32)  # 32 + 32 + 32 + 4 rows
    sliced = layer(x)
    assert sliced.shape == whole.shape  # (another matrix shape may sum in another order: rounding only)
    torch.testing.assert_close(sliced, whole, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(layer(x[:1, :1]), whole[:1, :1], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(whole.double(), F.linear(x.double(), reference.double()), rtol=1e-5, atol=1e-4)


def test_quantized_embedding_rows():
    tensor, reference = quantized_tensor(Q.Q8_0, out=50, n=64, seed=2)
    emb = QuantEmbedding(blocks_from_gguf(tensor))
    idx = torch.tensor([[3, 0, 49], [7, 7, 1]])
    assert torch.equal(emb(idx), F.embedding(idx, reference))


def test_other_types_are_left_to_the_dequantizer():
    w = np.zeros((4, 32), dtype=np.float32)
    assert blocks_from_gguf(SimpleNamespace(data=w, tensor_type=Q.F32)) is None


@pytest.mark.slow
def test_smollm2_from_its_blocks_decodes_as_the_dequantized_model(smollm2, smollm2_gguf, smollm2_tokenizer,
                                                                  cpp_compiler):
    """The real Q4_1 file (Q8_0 embedding, tied unembedding): logits within float32 rounding of the float32
    model dequantized by formats.gguf, and the same greedy tokens, eager and compiled, on three prompts."""
    from lumen.formats.gguf import load_gguf_quantized

    model, tok = load_gguf_quantized(smollm2_gguf)
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.blocks is model.tok_emb.blocks
    prompts = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, a little fox"]
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([tok.encode(prompt)])
            assert tok.encode(prompt) == smollm2_tokenizer.encode(prompt)
            torch.testing.assert_close(model(ids)[0], smollm2(ids)[0], rtol=0, atol=1e-3)
            want = smollm2.generate(ids, 16, temperature=0)
            assert torch.equal(model.generate(ids, 16, temperature=0), want)
            assert torch.equal(model.generate(ids, 16, temperature=0, compile=True), want)


def test_weights_gguf_needs_a_gguf_file_and_float32(tmp_path, capsys):
    from lumen.cli import main

    assert main(["generate", str(tmp_path), "--weights", "gguf", "--prompt", "x"]) == 2
    assert "--weights gguf needs a GGUF model" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "m.gguf"), "--weights", "gguf", "--prompt", "x"]) == 2
    assert "no GGUF file" in capsys.readouterr().err
    assert main(["generate", "smollm2", "--weights", "gguf", "--dtype", "bfloat16", "--prompt", "x"]) == 2
    assert "drop --dtype" in capsys.readouterr().err


def test_a_small_file_from_its_blocks_and_damaged_numbers(tmp_path):
    """A tiny GGUF with Q8_0 and Q4_1 matrices: decoded from its blocks, the logits of the float path
    (formats.gguf.load_gguf) to float32 rounding; a NaN block scale or norm gain is refused, naming the file
    and the tensor, instead of decoding NaN."""
    from gguf import GGUFReader

    from lumen.formats.gguf import GGUFError, load_gguf, load_gguf_quantized
    from test_gguf import tiny_model, write_gguf

    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model(), {"token_embd.weight": Q.Q8_0, "blk.0.ffn_up.weight": Q.Q4_1,
                                    "blk.1.attn_q.weight": Q.Q4_1, "blk.1.ffn_down.weight": Q.Q8_0})
    model, _ = load_gguf_quantized(path)
    reference, _ = load_gguf(path)
    assert isinstance(model.blocks[1].attn.q, QuantLinear)
    ids = torch.tensor([[5, 9, 2, 30, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids)[0], reference(ids)[0], rtol=1e-5, atol=1e-5)
    offsets = {t.name: int(t.data_offset) for t in GGUFReader(path).tensors}
    for name in ("blk.0.ffn_up.weight", "token_embd.weight", "blk.1.attn_norm.weight"):
        data = bytearray(path.read_bytes())
        nan = np.array(np.nan, np.float32 if name.endswith("norm.weight") else np.float16).tobytes()
        at = offsets[name]  # a float32 norm's first gain; a block's float16 scale comes first in its block
        data[at: at + len(nan)] = nan
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(bytes(data))
        with pytest.raises(GGUFError, match=rf"bad\.gguf.*{name}.*NaN"):
            load_gguf_quantized(bad)
