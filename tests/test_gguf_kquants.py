"""K-quants (Q2_K..Q6_K: what Q4_K_M, Q5_K_M, Q6_K files are made of) read from files whose blocks are packed
here from chosen codes: lumen's weights equal ggml's formula computed from the codes in float64, and a file mixing
every K type gives transformers' logits from its own reading of the same file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from helpers.gguf import (
    llama_cpp_permute,
    pack_q4_k,
    pack_q6_k,
    tiny_model,
    unpack_q4_k_formula,
    unpack_q6_k_formula,
    write_gguf,
)
from lumen.formats import load
from lumen.formats.gguf import read_gguf

IDS = torch.tensor([[5, 70, 3, 200, 17, 17, 99, 250, 1, 42, 8, 130]])


def wide_model(seed: int = 0):
    """tiny_model with rows of 256 numbers (a K-quant super-block) in every matrix."""
    torch.manual_seed(seed)
    from lumen.model import GPT

    return GPT(tiny_model().cfg.replace(d_model=256, d_ff=256, n_heads=4, n_kv_heads=2)).eval()


def q4_k(rows: int, cols: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(packed blocks (rows, bytes), the numbers they stand for (rows, cols) in float64)."""
    n = rows * cols // 256
    d, dmin = rng.uniform(1e-3, 4e-3, n).astype(np.float16), rng.uniform(1e-3, 4e-3, n).astype(np.float16)
    sc, m = rng.integers(0, 64, (n, 8)), rng.integers(0, 64, (n, 8))
    q = rng.integers(0, 16, (n, 256))
    packed = pack_q4_k(d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q)
    return packed.reshape(rows, -1), unpack_q4_k_formula(d, dmin, sc, m, q).reshape(rows, cols)


def q6_k(rows: int, cols: int, rng) -> tuple[np.ndarray, np.ndarray]:
    n = rows * cols // 256
    d = rng.uniform(1e-4, 4e-4, n).astype(np.float16)
    sc = rng.integers(-128, 128, (n, 16))
    q = rng.integers(0, 64, (n, 256))
    return pack_q6_k(d, sc, q).reshape(rows, -1), unpack_q6_k_formula(d, sc, q).reshape(rows, cols)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quant_numbers_follow_ggml_formula(tmp_path, kind):
    model, rng = wide_model(), np.random.default_rng(0)
    make, qtype = (q4_k, Q.Q4_K) if kind == "Q4_K" else (q6_k, Q.Q6_K)
    raw, want = {}, {}
    for gguf_name, ours, rows in (("blk.0.attn_q.weight", "blocks.0.attn.q.weight", 256),
                                  ("blk.1.attn_k.weight", "blocks.1.attn.k.weight", 128),
                                  ("blk.1.ffn_down.weight", "blocks.1.mlp.w_down.weight", 256)):
        packed, numbers = make(rows, 256, rng)
        assert packed.shape[1] == GGML_QUANT_SIZES[qtype][1]
        raw[gguf_name], want[ours] = (packed, qtype), numbers
    path = tmp_path / f"{kind}.gguf"
    write_gguf(path, model, raw=raw)
    state = read_gguf(path).state
    heads = {"blocks.0.attn.q.weight": 4, "blocks.1.attn.k.weight": 2}
    for ours, numbers in want.items():
        got = state[ours].double().numpy()
        if ours in heads:  # the file holds llama.cpp's row order: lumen's rows, permuted, are the file's
            got = llama_cpp_permute(got, heads[ours])
        np.testing.assert_allclose(got, numbers, rtol=2**-23, atol=0, err_msg=ours)


def random_blocks(kind: Q, rows: int, cols: int, rng) -> np.ndarray:
    """Random codes of any type, its float16 scale fields set to small numbers (random bytes would be NaN or
    huge), so the weights are of a trained model's size."""
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    # where each type keeps its float16 super-block scale(s): ggml's block_q*_K structs
    fields = {Q.Q2_K: (size - 4, size - 2), Q.Q3_K: (size - 2,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (size - 2,)}
    for at in fields[kind]:
        raw[:, at:at + 2] = rng.uniform(1e-4, 2e-3, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def test_every_k_type_matches_transformers(tmp_path, hf_from_gguf):
    """A Q4_K_M-like file (and then some): each K type on some matrices, the rest float32."""
    model, rng = wide_model(1), np.random.default_rng(1)
    kinds = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
    names = [f"blk.{i}.{n}" for i in range(2) for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight",
                                                        "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                                                        "ffn_down.weight")]
    sd = model.state_dict()
    shapes = {f"blk.{i}.{g}": tuple(sd[f"blocks.{i}.{o}"].shape) for i in range(2)
              for g, o in (("attn_q.weight", "attn.q.weight"), ("attn_k.weight", "attn.k.weight"),
                           ("attn_v.weight", "attn.v.weight"), ("attn_output.weight", "attn.out.weight"),
                           ("ffn_gate.weight", "mlp.w_gate.weight"), ("ffn_up.weight", "mlp.w_up.weight"),
                           ("ffn_down.weight", "mlp.w_down.weight"))}
    raw = {n: (random_blocks(kinds[j % 5], *shapes[n], rng), kinds[j % 5]) for j, n in enumerate(names)}
    path = tmp_path / "k.gguf"
    write_gguf(path, model, raw=raw)
    with torch.no_grad():
        ours, _ = load(str(path)).model(IDS)
        theirs = hf_from_gguf(path)(IDS).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 * float(theirs.abs().max()))
