"""lumen.fast's GGUF path (quads.py, quant.py, kernels.py, loading.py): products computed from a GGUF's Q4_1/Q8_0
blocks against the gguf package's own dequantized matrices, and the real SmolLM2 decoded from its blocks against
the dequantized float32 model."""

from __future__ import annotations

import platform
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

from helpers.cross import BUILDS, check_program  # noqa: E402
from lumen.fast.quant import QuantEmbedding, QuantLinear, QuantMatrix  # noqa: E402
from lumen.formats.gguf import stored_quantized  # noqa: E402
from lumen.runtime import cpu  # noqa: E402

TYPES = [Q.Q4_1, Q.Q8_0]
# SmolLM2's logits, the same float32 model by two routes (the unembedding by slabs or whole): float32 rounding,
# of a stream whose first position reaches ~23,000 (a float32 step of ~0.002 there). Measured: 0, or 3.1e-3 at
# one logit, depending on which tests ran before in the process (the matmul library's path, not the model).
FLOAT_ROUNDING = 1e-2


def blocks_from_gguf(tensor) -> QuantMatrix:
    """A matrix's blocks as formats.gguf reads them from the file, as lumen.fast keeps them."""
    stored = stored_quantized(tensor)
    assert stored is not None
    return QuantMatrix(*stored)


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
    assert blocks.shape == (96, 160)
    if qtype == Q.Q4_1:  # the codes are the file's bytes: two to a byte, after each block's scale and minimum
        stored = np.asarray(tensor.data).reshape(96, 5, 20)[..., 4:].reshape(96, 80)
        codes = blocks.file_rows()[0]
        assert codes.dtype == torch.uint8 and torch.equal(codes, torch.from_numpy(stored))
    else:
        codes = blocks.file_rows()[0]
        assert codes.dtype == torch.int8 and codes.shape == (96, 160)


def rounded_reference(x: torch.Tensor, tensor, reference: torch.Tensor) -> torch.Tensor:
    """x @ w.T for one row, x rounded to 8 bits per block as llama.cpp's quantize_row_q8_0 rounds it (x times the
    reciprocal of its step, max|x| / 127, in float32, to nearest; the gguf package divides instead, and a number
    within a float32 rounding of a half-step can land on the other side), in float64: sum_b d dx (q . xq) +
    m sum(x)."""
    out, n = reference.shape
    xb = x.reshape(-1, 32).numpy()
    step32 = np.abs(xb).max(-1) / np.float32(127)
    inv = np.where(step32 > 0, np.float32(1) / np.where(step32 > 0, step32, 1), 0).astype(np.float32)
    xq = np.rint(xb * inv[:, None]).astype(np.float64)  # the codes (float32 products, ties to even)
    step = step32.astype(np.float64)
    if tensor.tensor_type == Q.Q8_0:  # w = d q: d q . dx xq
        return torch.from_numpy(reference.double().numpy() @ (xq * step[:, None]).reshape(n))
    raw = np.asarray(tensor.data).reshape(out, n // 32, 20)
    d, m = (raw[..., a:a + 2].copy().view(np.float16)[..., 0].astype(np.float64) for a in (0, 2))
    q = (reference.double().numpy().reshape(out, n // 32, 32) - m[..., None]) / d[..., None]  # the codes
    return torch.from_numpy(((d * step) * (np.rint(q) * xq).sum(-1)).sum(-1) + (m * xb.sum(-1)).sum(-1))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("out", [1, 7, 50, 96])
def test_quads_hold_the_files_bytes_in_another_order(qtype, out, monkeypatch):
    """QuantMatrix keep a matrix in quads (quads.pack, a slab of rows at a time): four rows, four blocks at a time,
    codes then scales (and minima). Each byte of the file's blocks is there once (the rows past the matrix are
    zeros), and `file_rows` gives back the file's layout, for every row, any slice and any list of rows."""
    from lumen.fast import quads
    from lumen.fast.quads import ROWS

    monkeypatch.setattr(quads, "SLAB", 8)  # (50 rows: slabs of 8, 8, ..., 2)

    for n in (32, 96, 128, 544):  # 1, 3, 4 and 17 blocks: a row's last group of 1-4
        tensor, _ = quantized_tensor(qtype, out, n, seed=n)
        codes, scale, minimum = stored_quantized(tensor)
        blocks = QuantMatrix(codes, scale, minimum)
        file_bytes = np.asarray(tensor.data, dtype=np.uint8).reshape(-1)
        quads, zeros = blocks.quads.numpy().reshape(-1), (-out % ROWS) * file_bytes.size // out  # (padding rows)
        assert blocks.quads.shape[0] == -(-out // ROWS) and quads.size == file_bytes.size + zeros
        counts = np.bincount(quads, minlength=256) - np.bincount(file_bytes, minlength=256)
        assert counts[0] == zeros and not counts[1:].any()
        pick = torch.tensor([[out - 1, 0], [0, out // 3]])
        for rows in (slice(None), slice(1, out), slice(out // 2, out // 2 + 1), pick):
            for got, want in zip(blocks.file_rows(rows), (codes, scale, minimum)):
                assert (got is None) == (want is None) and (want is None or torch.equal(got, want[rows]))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize(("out", "n"), [(1, 32), (7, 96), (12, 64), (8, 128), (33, 544), (50, 1056)])
def test_kernels_at_every_count_of_rows_and_blocks(qtype, out, n, cpp_compiler):
    """quant.cpp walks a matrix in quads, four rows and four blocks at a time (with AVX-512; one row and one
    block at a time of the same layout with AVX2), and splits the quads between threads: rows past the last
    quad's, a last group of 1-4 blocks, all meet the float64 formula, at one thread and at two."""
    from lumen.fast import kernels

    if not kernels.load():
        pytest.skip("quant.cpp does not build here (it needs an x86-64 CPU with AVX2, g++ and ninja)")
    tensor, reference = quantized_tensor(qtype, out, n, seed=out)
    blocks = blocks_from_gguf(tensor)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    want = rounded_reference(x, tensor, reference)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = blocks.row_product(x)
            assert y.shape == (out,)
            torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize(("out", "n"), [(7, 96), (33, 544), (50, 1056)])
def test_a_prompts_rows_each_get_a_decoded_tokens_numbers(qtype, out, n, monkeypatch):
    """Many rows by quant.cpp's prompt kernel (panels of 16 rows of w with AVX-512, 8 with AVX2, against 3 or 4
    rows of x at a time; a stretch of 256 rows at a time): each row's products bit for bit those the one-row
    kernel gives it alone, and the float64 formula's, for counts of rows that leave every remainder of the tiles
    and stretches, at one thread and two; torch's formula (no kernel) gives the same numbers to float32 rounding."""
    from lumen.fast import kernels

    if not kernels.load():
        pytest.skip("quant.cpp does not build here (it needs an x86-64 CPU with AVX2, or ARM64, g++ and ninja)")
    tensor, reference = quantized_tensor(qtype, out, n, seed=out)
    blocks = blocks_from_gguf(tensor)
    x = torch.randn(263, n, generator=torch.Generator().manual_seed(n))
    want = torch.stack([rounded_reference(row, tensor, reference) for row in x])
    alone = torch.stack([blocks.row_product(row) for row in x])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in (2, 3, 5, 64, 67, 131, 263):  # (263: a stretch of 256 and 7 more)
                y = blocks.row_product(x[:m])
                assert y.shape == (m, out) and torch.equal(y, alone[:m])
            torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)
    monkeypatch.setattr(kernels, "_library", False)
    torch.testing.assert_close(blocks.row_product(x[:5].reshape(1, 5, n))[0].double(), want[:5], rtol=1e-5, atol=1e-4)


AVX2_ONLY = """
import os, sys, torch
from lumen.fast import kernels
kernels.CFLAGS = ["-O3", *sys.argv[2].split(), "-fopenmp"]  # AVX2 and FMA, no AVX-512: the kernel's other path
assert kernels.load()
sys.path.insert(0, sys.argv[1])
from test_quant import Q, blocks_from_gguf, quantized_tensor, rounded_reference
for qtype in (Q.Q4_1, Q.Q8_0):
    for out, n in ((7, 96), (12, 64), (33, 544)):
        tensor, reference = quantized_tensor(qtype, out, n, seed=out)
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        rows = torch.randn(7, n, generator=torch.Generator().manual_seed(out))
        for threads in (1, 2):
            torch.set_num_threads(threads)
            blocks = blocks_from_gguf(tensor)
            y = blocks.row_product(x)
            torch.testing.assert_close(y.double(), rounded_reference(x, tensor, reference), rtol=1e-5, atol=1e-4)
            assert torch.equal(blocks.row_product(rows), torch.stack([blocks.row_product(r) for r in rows]))
print("ok")
"""


@pytest.mark.parametrize("flags", ["-march=x86-64-v3", "-march=x86-64-v3 -mavxvnni"], ids=["avx2", "avx2+vnni"])
def test_the_kernels_avx2_path_on_the_same_quads(tmp_path, cpp_compiler, flags):
    """quant.cpp built for a CPU with AVX2 but no AVX-512 (four rows and two blocks at a time, in 256-bit
    registers; byte products by pairs, as on a Zen 1, or by AVX-VNNI) meets the same float64 formula, and a
    prompt's rows get the one-row numbers: built in a process of its own, into a cache of its own."""
    if not cpu.has("avx2", "fma") or shutil.which("ninja") is None:
        pytest.skip("needs an x86-64 CPU with avx2 and fma, and ninja")
    if "vnni" in flags and not cpu.has("avx_vnni"):
        pytest.skip("the AVX-VNNI build needs a CPU with avx_vnni")
    import os
    import subprocess
    import sys

    env = {**os.environ, "LUMEN_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", AVX2_ONLY, str(Path(__file__).parent), flags], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@pytest.mark.parametrize("with_kernel", [True, False], ids=["quant.cpp", "torch"])
@pytest.mark.parametrize("qtype", TYPES)
def test_products_equal_their_references(qtype, with_kernel, cpp_compiler, monkeypatch):
    """Many rows: F.linear in float64 on the gguf package's dequantized weight, to float32 rounding. One row
    (a decoded token; eager and compiled): x rounded to 8 bits per block as llama.cpp rounds it, against that
    formula computed from the gguf package's quantizer in float64 — by quant.cpp's kernel, and by torch's
    formula where the kernel is not built."""
    from lumen.fast import kernels

    if with_kernel and not (cpu.has("avx2", "fma") or cpu.arch() == "aarch64"):
        pytest.skip("quant.cpp needs an x86-64 CPU with avx2 and fma, or ARM64")
    if with_kernel and shutil.which("ninja") is None:
        pytest.skip("torch builds quant.cpp with ninja (apt-get install -y ninja-build)")
    assert kernels.load() or not with_kernel  # where it can be built, it is (else decoding is ~2x slower)
    monkeypatch.setattr(kernels, "_library", with_kernel)
    tensor, reference = quantized_tensor(qtype, seed=1)
    layer = QuantLinear(blocks_from_gguf(tensor))
    torch.manual_seed(1)
    x = torch.randn(3, 5, 160)
    compiled = torch.compile(layer, dynamic=False)
    with torch.inference_mode():
        want = F.linear(x.double(), reference.double())
        torch.testing.assert_close(layer(x).double(), want, rtol=1e-5, atol=1e-4)
        one = rounded_reference(x[0, 0], tensor, reference)
        assert not torch.allclose(one, want[0, 0], rtol=1e-4, atol=1e-3)  # the rounding of x shows...
        scale = float(want[0, 0].abs().max())  # ...as the small error it is (~1% of the largest output)
        torch.testing.assert_close(one, want[0, 0], rtol=0, atol=0.02 * scale)
        for fn in (layer, compiled):
            y = fn(x[:1, :1])
            assert y.shape == (1, 1, 96) and y.dtype == torch.float32
            torch.testing.assert_close(y[0, 0].double(), one, rtol=1e-5, atol=1e-4)
        before = torch.get_num_threads()
        try:  # the rows split between threads (quant.cpp is built with OpenMP): each row's sum is unchanged
            torch.set_num_threads(1)
            alone = layer(x[:1, :1])
            torch.set_num_threads(2)
            assert torch.equal(layer(x[:1, :1]), alone)
        finally:
            torch.set_num_threads(before)


def test_products_by_slabs_of_rows(monkeypatch):
    """The weight is used a slab of rows at a time (many rows dequantized; one row by torch's formula): uneven
    slabs give the products of the whole matrix."""
    from lumen.fast import quant

    tensor, reference = quantized_tensor(Q.Q4_1, out=100, seed=3)
    layer = QuantLinear(blocks_from_gguf(tensor))
    x = torch.randn(2, 4, 160)
    whole, row = layer(x), layer.matrix.rounded_row_product(x[0, 0])
    monkeypatch.setattr(quant, "SLAB", 32)  # 32 + 32 + 32 + 4 rows
    sliced = layer(x)
    assert sliced.shape == whole.shape  # (another matrix shape may sum in another order: rounding only)
    torch.testing.assert_close(sliced, whole, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(layer.matrix.rounded_row_product(x[0, 0]), row, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(whole.double(), F.linear(x.double(), reference.double()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qtype", TYPES)
def test_quantized_embedding_rows(qtype):
    tensor, reference = quantized_tensor(qtype, out=50, n=64, seed=2)
    emb = QuantEmbedding(blocks_from_gguf(tensor))
    idx = torch.tensor([[3, 0, 49], [7, 7, 1]])
    assert torch.equal(emb(idx), F.embedding(idx, reference))


def test_kernels_that_do_not_build_say_why_and_leave_nothing(tmp_path, monkeypatch, capsys, cpp_compiler):
    """A kernel source that does not compile: one line saying why and what runs instead, False (torch's
    formula is used), and no half-built library left in the cache for the next run to load."""
    from lumen.fast import kernels

    if shutil.which("ninja") is None:
        pytest.skip("torch builds with ninja (apt-get install -y ninja-build)")
    broken = tmp_path / "quant.cpp"
    broken.write_text("#include <torch/library.h>\nthis is not C++;\n")
    monkeypatch.setenv("LUMEN_CACHE", str(tmp_path / "cache"))
    assert kernels._load((broken,)) is False
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("lumen: building the speed wing's kernels")
    assert len(err) == 2 and "did not build" in err[1] and "torch's formula" in err[1]
    assert not list((tmp_path / "cache" / "kernels").iterdir())


def test_kernels_without_their_build_tools_say_so(tmp_path, monkeypatch, capsys):
    """No ninja (or no compiler): one line naming what to install, False, and nothing written to the cache."""
    from lumen.fast import kernels

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("quant.cpp is for x86-64")
    monkeypatch.setenv("LUMEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels.shutil, "which", lambda name: None if name == "ninja" else f"/usr/bin/{name}")
    assert kernels._load() is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ninja-build" in err[0] and "torch's formula" in err[0]
    assert not (tmp_path / "cache").exists()


def test_other_types_are_left_to_the_dequantizer():
    w = np.zeros((4, 32), dtype=np.float32)
    assert stored_quantized(SimpleNamespace(data=w, tensor_type=Q.F32)) is None


def teacher_forced(model, ids: torch.Tensor, continuation: torch.Tensor) -> torch.Tensor:
    """The logits of each decoding step (one token at a time through the KV cache) along a given
    continuation: (len(continuation), vocab), the first from the prompt's last position."""
    from lumen.attention import KVCache

    cache = KVCache(model.cfg, 1, ids.size(1) + continuation.size(0), ids.device, torch.float32)
    steps = [model(ids, cache=cache)[0][0, -1]]
    for t in continuation[:-1]:
        steps.append(model(t.view(1, 1), cache=cache)[0][0, -1])
    return torch.stack(steps)


@pytest.mark.slow
def test_smollm2_from_its_blocks_decodes_as_the_dequantized_model(smollm2, smollm2_gguf, smollm2_tokenizer,
                                                                  cpp_compiler):
    """The real Q4_1 file (Q8_0 embedding, tied unembedding), against the float32 model dequantized by
    formats.gguf, on three prompts. A prompt (many rows): the same logits to float32 rounding. Decoding (one
    row: x rounded to 8 bits per block, as llama.cpp rounds it), step by step along the float model's greedy
    continuation: mean KL under 0.03 nats (measured 0.006-0.015) and the same top token at >= 85% of 64 steps
    (measured 94-95%); the first 4 greedy tokens through the speed wing's door, eager and compiled (but for a
    near tie), are the plain model's with its prompt rounded as the door rounds it (`rounded_prompts`); at a decoding
    step, each of the 211 products by quant.cpp equals torch's formula's to float32 rounding (whole steps do
    not: a number rounded to the other side of a half-step changes the next layer's 8-bit x, as it would
    between any two such runs)."""
    from lumen.fast import generate, kernels, load_quantized
    from lumen.fast.changes import Changes
    from lumen.fast.quant import rounded_prompts

    loaded = load_quantized(str(smollm2_gguf))
    model, tok = loaded.model, loaded.tokenizer
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.matrix is model.tok_emb.matrix
    prompts = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, a little fox"]
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([tok.encode(prompt)])
            assert tok.encode(prompt) == smollm2_tokenizer.encode(prompt)
            torch.testing.assert_close(model(ids)[0], smollm2(ids)[0], rtol=0, atol=FLOAT_ROUNDING)
            want = smollm2.generate(ids, 64, temperature=0)
            reference = smollm2(want)[0][0, ids.size(1) - 1:-1].log_softmax(-1)  # each step's distribution
            steps = teacher_forced(model, ids, want[0, ids.size(1):]).log_softmax(-1)
            kl = (reference.exp() * (reference - steps)).sum(-1)
            assert float(kl.mean()) < 0.03
            assert float((steps.argmax(-1) == reference.argmax(-1)).float().mean()) >= 0.85
            with Changes() as changes:  # the door's prompt: each row rounded as a token's (the float model's
                rounded_prompts(model, changes)  # first token may differ: "def fibonacci(n):\n" is one such)
                plain = model.generate(ids, 8, temperature=0)
                top2 = model(ids)[0][0, -1].topk(2)
            for compile in (False, True):
                got = generate(model, ids, 8, temperature=0, compile=compile)
                if compile and float(top2.values[0] - top2.values[1]) < 1:
                    # compiled, the norms and attention round otherwise, and a number on the other side of a
                    # half-step of the 8-bit x moves the next layer's: a near tie (fibonacci's, 0.53) may go
                    # either way
                    assert int(got[0, ids.size(1)]) in top2.indices.tolist()
                    continue
                assert torch.equal(got[:, : ids.size(1) + 4], plain[:, : ids.size(1) + 4])
        if kernels.load():  # every matrix's product at a real decoding step: kernel and formula agree
            inputs = {}

            def keep(layer, args):  # a one-row input (the prompt's many rows come first)
                if args[0].shape[:-1].numel() == 1:
                    inputs.setdefault(layer, args[0].reshape(-1))

            hooks = [m.register_forward_pre_hook(keep) for m in model.modules() if isinstance(m, QuantLinear)]
            teacher_forced(model, ids, want[0, ids.size(1): ids.size(1) + 2])
            for h in hooks:
                h.remove()
            assert len(inputs) == 30 * 7 + 1
            for layer, x in inputs.items():
                b = layer.matrix
                torch.testing.assert_close(b.row_product(x), b.rounded_row_product(x), rtol=1e-5, atol=1e-4)


@pytest.mark.smoke  # (the block path's real-model test in make test)
def test_smollm2_from_its_blocks_reads_a_prompt_as_the_float_model_and_answers(smollm2, smollm2_tokenizer):
    """The real file's Q4_1/Q8_0 matrices kept as blocks (QuantLinear layers, the tied unembedding reading the
    embedding's blocks): a prompt's logits are the dequantized float32 model's to float32 rounding, and the
    first decoded token (8-bit x, the kernel or torch's formula) is still " Paris"."""
    from lumen.fast import generate, load_quantized

    model = load_quantized("smollm2").model
    assert isinstance(model.blocks[0].attn.q, QuantLinear) and model.lm_head.matrix is model.tok_emb.matrix
    ids = torch.tensor([smollm2_tokenizer.encode("The capital of France is")])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids)[0], smollm2(ids)[0], rtol=0, atol=FLOAT_ROUNDING)
    nxt = generate(model, ids, 2, temperature=0)[0, ids.size(1):]
    assert smollm2_tokenizer.decode(nxt[:1].tolist()) == " Paris"


@pytest.mark.smoke  # (the door's prompt in make test)
def test_the_decoding_doors_prompt_is_rounded_as_its_tokens_are(smollm2, smollm2_tokenizer):
    """Inside lumen.fast.decoding, a GGUF's prompt is multiplied as llama.cpp multiplies one (each row rounded to
    8 bits per block, byte products): every layer's output for the prompt is, bit for bit, its rows' one-row
    products; the logits stay within the rounding of x of the dequantized float32 model's (KL < 0.06 nats on
    average, the same top token at the last position); on leaving, the prompt is the float32 model's again."""
    from lumen.fast import decoding, kernels, load_quantized

    if not kernels.load():
        pytest.skip("quant.cpp does not build here (it needs an x86-64 CPU with AVX2, or ARM64, g++ and ninja)")
    model = load_quantized("smollm2").model
    ids = torch.tensor([smollm2_tokenizer.encode("The capital of France is the city of")])
    seen = []
    with torch.inference_mode():
        plain = model(ids)[0]
        with decoding(model):
            hooks = [m.register_forward_hook(lambda m, args, y: seen.append((m, args[0], y)))
                     for m in model.modules() if isinstance(m, QuantLinear)]
            rounded = model(ids)[0]
            for h in hooks:
                h.remove()
        assert len(seen) == 30 * 7 + 1
        for layer, x, y in seen:
            assert torch.equal(y[0], torch.stack([layer.matrix.row_product(row) for row in x[0]]))
        want = smollm2(ids)[0][0].log_softmax(-1)
        kl = (want.exp() * (want - rounded[0].log_softmax(-1))).sum(-1)
        # (the rounding of x shows, as a small error: measured 0.03 nats on average, the most at the first
        # position, whose massive activations leave its other numbers few of the 8 bits)
        assert 0 < float(kl.mean()) < 0.06
        assert int(rounded[0, -1].argmax()) == int(want[-1].argmax())
        assert torch.equal(model(ids)[0], plain)


def test_weights_gguf_needs_a_gguf_file_and_float32(tmp_path, capsys):
    from lumen.cli import main

    assert main(["generate", str(tmp_path), "--weights", "gguf", "--prompt", "x"]) == 2
    assert "--weights gguf needs a GGUF model" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "m.gguf"), "--weights", "gguf", "--prompt", "x"]) == 2
    assert "no model at" in capsys.readouterr().err
    assert main(["generate", "smollm2", "--weights", "gguf", "--dtype", "bfloat16", "--prompt", "x"]) == 2
    assert "drop --dtype" in capsys.readouterr().err


def test_a_small_file_from_its_blocks_and_damaged_numbers(tmp_path):
    """A tiny GGUF with Q8_0 and Q4_1 matrices: decoded from its blocks, the logits of the float path
    (lumen.formats.load) to float32 rounding; a NaN block scale or norm gain is refused, naming the file
    and the tensor, instead of decoding NaN."""
    from gguf import GGUFReader

    from helpers.gguf import tiny_model, write_gguf
    from lumen.errors import ModelFileError
    from lumen.fast import load_quantized
    from lumen.formats import load

    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model(), {"token_embd.weight": Q.Q8_0, "blk.0.ffn_up.weight": Q.Q4_1,
                                    "blk.1.attn_q.weight": Q.Q4_1, "blk.1.ffn_down.weight": Q.Q8_0})
    model, reference = load_quantized(str(path)).model, load(path).model
    assert isinstance(model.blocks[1].attn.q, QuantLinear)
    ids = torch.tensor([[5, 9, 2, 30, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids)[0], reference(ids)[0], rtol=1e-5, atol=1e-5)
    offsets = {t.name: int(t.data_offset) for t in GGUFReader(path).tensors}
    # (the norm's gain is checked where every format's float tensors are, in GPT.from_state: lumen's name)
    for name, said in (("blk.0.ffn_up.weight",) * 2, ("token_embd.weight",) * 2,
                       ("blk.1.attn_norm.weight", "blocks.1.ln1.g")):
        data = bytearray(path.read_bytes())
        nan = np.array(np.nan, np.float32 if name.endswith("norm.weight") else np.float16).tobytes()
        at = offsets[name]  # a float32 norm's first gain; a block's float16 scale comes first in its block
        data[at: at + len(nan)] = nan
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(bytes(data))
        with pytest.raises(ModelFileError, match=rf"bad\.gguf.*{re.escape(said)}.*NaN"):
            load_quantized(str(bad))


def test_matrices_of_one_row_multiply_as_one_stack(tmp_path):
    """share_rows (the decoding door's): a block's q, k and v of one block type, and its gate and up, become one
    stack each, their blocks rows of it (no memory added); a decoded token's products, and a prompt's, are
    each matrix's own products (computed before sharing); mixed types stay apart; leaving the changes undoes it."""
    from helpers.gguf import tiny_model, write_gguf
    from lumen.fast import load_quantized
    from lumen.fast.changes import Changes
    from lumen.fast.quant import SharedQuantLinear, share_rows

    path = tmp_path / "tiny.gguf"
    types = {f"blk.0.{n}.weight": Q.Q4_1 for n in ("attn_q", "attn_k", "attn_v")}
    types |= {"blk.0.ffn_gate.weight": Q.Q8_0, "blk.0.ffn_up.weight": Q.Q8_0}
    types |= {"blk.1.attn_q.weight": Q.Q4_1, "blk.1.attn_k.weight": Q.Q8_0, "blk.1.attn_v.weight": Q.Q4_1}
    write_gguf(path, tiny_model(), types)
    model = load_quantized(str(path)).model
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    names = [(attn, "q"), (attn, "k"), (attn, "v"), (mlp, "w_gate"), (mlp, "w_up"), (model.blocks[1].attn, "q")]
    one, many = torch.randn(1, 1, 64), torch.randn(1, 5, 64)
    with torch.inference_mode():
        before = [(getattr(m, n)(one), getattr(m, n)(many)) for m, n in names]
        with Changes() as changes:
            assert share_rows(model, changes) == 2
            layers = [getattr(m, n) for m, n in names]
            assert [type(x) is SharedQuantLinear for x in layers] == [True] * 5 + [False]
            for group in (layers[:3], layers[3:5]):
                stack = group[0].shared.matrix.quads
                assert all(x.shared is group[0].shared for x in group)
                assert all(x.matrix.quads.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
                           for x in group)
                assert 4 * stack.shape[0] == sum(x.out_features for x in group)
                assert stack.data_ptr() == group[0].matrix.quads.data_ptr()  # (one after another already: no copy)
            after = [(x(one), x(many)) for x in layers]
            for (y1, yn), (z1, zn) in zip(before, after):
                torch.testing.assert_close(z1, y1, rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(zn, yn, rtol=1e-6, atol=1e-6)
            assert layers[0].shared.row is None  # (let go once the last of the group read its product)
        assert all(type(x) is QuantLinear and not hasattr(x, "shared") for x in layers)
        for (y1, _), x in zip(before, layers):
            torch.testing.assert_close(x(one), y1, rtol=1e-6, atol=1e-6)


def test_a_models_matrices_lie_in_one_buffer_in_the_order_a_token_reads_them(tmp_path):
    """load_quantized puts every matrix's quads in one buffer, block by block, each block's matrices in the order
    its forward reads them, the (tied) unembedding last: the memory a product asks for ahead of its reads runs
    on into the next product's matrix."""
    from helpers.gguf import tiny_model, write_gguf
    from lumen.fast import load_quantized

    path = tmp_path / "tiny.gguf"
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    types = {f"blk.{i}.{n}.weight": (Q.Q4_1, Q.Q8_0)[(i + j) % 2] for i in range(2) for j, n in enumerate(names)}
    write_gguf(path, tiny_model(), {"token_embd.weight": Q.Q8_0, **types})
    model = load_quantized(str(path)).model
    reads = []  # the matrices in the order a decoded token multiplies them
    hooks = [m.register_forward_pre_hook(lambda m, args: reads.append(m.matrix))
             for m in model.modules() if isinstance(m, QuantLinear)]
    with torch.inference_mode():
        model(torch.tensor([[3]]))
    for h in hooks:
        h.remove()
    assert len(reads) == len({id(b) for b in reads}) == 2 * 7 + 1 and reads[-1] is model.tok_emb.matrix
    buffer = reads[0].quads
    for a, b in zip(reads, reads[1:]):
        assert b.quads.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert b.quads.data_ptr() == a.quads.data_ptr() + a.quads.nbytes



@pytest.mark.slow
@pytest.mark.parametrize("build", list(BUILDS))
def test_quads_arithmetic_without_torch_on_each_instruction_set(build, tmp_path):
    """quads.h (the block products' arithmetic, no torch) built for each instruction set, ARM64's NEON with and
    without its dot-product instructions under emulation, multiplies lumen's own quads as the float64 formula
    says, a prompt's rows (6: a tile of four and two more) each bit for bit as it would alone (the program
    checks that) (the x86 builds on this machine only where it has their instructions)."""
    import struct
    import subprocess

    command = check_program("quads_check.cpp", build, tmp_path)
    for qtype in (Q.Q4_1, Q.Q8_0):
        for out, n in ((7, 96), (12, 64), (33, 544)):
            tensor, reference = quantized_tensor(qtype, out, n, seed=out)
            quads = blocks_from_gguf(tensor).quads
            x = torch.randn(6, n, generator=torch.Generator().manual_seed(n))
            problem = tmp_path / "problem"
            problem.write_bytes(struct.pack("<5q", int(qtype == Q.Q4_1), n, *quads.shape, len(x))
                                + x.numpy().tobytes() + quads.numpy().tobytes())
            done = subprocess.run([*command, str(problem), str(tmp_path / "y")], timeout=120)
            assert done.returncode != 5, "a prompt's row got other numbers than it gets alone"
            assert done.returncode == 0
            y = torch.from_numpy(np.fromfile(tmp_path / "y", dtype=np.float32)).reshape(len(x), -1)[:, :out]
            want = torch.stack([rounded_reference(row, tensor, reference) for row in x])
            torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
