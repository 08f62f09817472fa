"""The Python entry points for looking inside: GPT.run_with_cache, callable tokenizers, cache keys that
name the closest valid ones (the docstrings' examples run in test_doctests.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lumen
from lumen import GPT, ModelConfig
from lumen.errors import UserError
from lumen.inspect import activation_names, run_with_cache
from lumen.tokenizers import ByteTokenizer, CharTokenizer, train_bpe

TINY = ModelConfig(vocab_size=50, context=16, d_model=32, n_layers=3, n_heads=4)


def test_run_with_cache_method_is_the_inspect_function():
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    idx = torch.randint(0, 50, (2, 7))
    logits, cache = model.run_with_cache(idx)
    ref_logits, ref = run_with_cache(model, idx)
    with torch.no_grad():
        plain = model(idx)[0]
    # the model's own output (the attention scores and patterns are read on the plain softmax path: equal to
    # rounding); without them the fused path runs, bit for bit
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-6)
    assert torch.equal(model.run_with_cache(idx, names=lambda n: not n.endswith(("pattern", "scores")))[0], plain)
    assert list(cache) == list(ref) == activation_names(model)
    assert all(torch.equal(cache[k], ref[k]) for k in ref)
    # the stream after the last block is what the final norm reads
    torch.testing.assert_close(model.ln_f(cache["blocks.2.resid_post"]), cache["final"])
    some = ["blocks.0.attn_out", "final"]
    assert list(model.run_with_cache(idx, names=some)[1]) == some


def test_the_core_model_does_not_import_inspect():
    code = "import sys, lumen.model; print(sorted(m for m in sys.modules if m.startswith('lumen.inspect')))"
    env_path = str(Path(lumen.__file__).parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": env_path, "PATH": ""}).stdout
    assert out.strip() == "[]"


def test_a_wrong_cache_key_names_the_closest_valid_ones():
    model = GPT(TINY).eval()
    idx = torch.zeros(1, 4, dtype=torch.long)
    _, cache = model.run_with_cache(idx)
    with pytest.raises(KeyError) as e:
        cache["blocks.1.resid_pots"]
    assert isinstance(e.value, UserError) and "'blocks.1.resid_post'" in str(e.value)
    _, some = model.run_with_cache(idx, names=["blocks.0.resid_post"])
    with pytest.raises(UserError, match="not in this cache"):
        some["blocks.0.mlp_out"]
    with pytest.raises(UserError, match="'blocks.2.attn_pattern'"):
        model.run_with_cache(idx, names=["blocks.2.attn_patern"])
    with pytest.raises(UserError, match=r"names are embed, final, final_scale and blocks\.<i>"):
        cache["xyz"]
    assert "blocks.1.resid_pots" not in cache and cache.get("nope") is None   # the dict's own behaviour stays


@pytest.mark.parametrize("tok", [CharTokenizer.from_text("abc de"), ByteTokenizer(),
                                 train_bpe(["the cat sat on the mat"] * 20, vocab_size=270)],
                         ids=["char", "byte", "bpe"])
def test_a_tokenizer_is_called_like_encode(tok):
    text = "the cat" if tok.kind != "char" else "a bad cede"
    assert tok(text) == tok.encode(text) and tok.decode(tok(text)) == text
