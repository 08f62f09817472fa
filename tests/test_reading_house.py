"""The reading house: a model loaded from any format holds only the chapter's classes and runs their code;
the speed wing (lumen.fast) is entered only through its door, and leaves the model as it found it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from lumen import GPT, fast
from lumen.attention import MultiHeadAttention, RoPE
from lumen.block import (
    MLP,
    GeGLU,
    LayerNorm,
    OffsetRMSNorm,
    ParallelBlock,
    PostLNBlock,
    RMSNorm,
    SwiGLU,
    TransformerBlock,
)
from lumen.formats import load
from lumen.formats.checkpoint import save_checkpoint
from lumen.formats.hf import save_hf_dir
from lumen.tokenizers import ByteTokenizer

CODE = Path(__file__).resolve().parents[1] / "code"
# what the chapter's code (block.py, attention.py, model.py) builds, and the torch.nn pieces it uses as they are
CHAPTER = {GPT, TransformerBlock, PostLNBlock, ParallelBlock, LayerNorm, RMSNorm, OffsetRMSNorm, MLP, SwiGLU, GeGLU,
           MultiHeadAttention, RoPE, nn.Linear, nn.Embedding, nn.Dropout, nn.ModuleList, nn.Identity}


def classes(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules()}


def tiny(preset: str, **changes) -> GPT:
    torch.manual_seed(0)
    return GPT.from_preset(preset, n_layers=2, d_model=64, n_heads=4, vocab_size=256, **changes).eval()


FAMILIES = {"gpt2": ("baby-gpt", {}), "llama": ("baby-llama", {"n_kv_heads": 2}),
            "neox": ("pythia-70m", {"context": 64}), "gemma": ("gemma-2b", {"d_head": 16, "context": 64})}


@pytest.mark.parametrize("preset, changes", FAMILIES.values(), ids=FAMILIES.keys())
def test_every_format_loads_the_chapters_classes(preset, changes, tmp_path):
    model = tiny(preset, **changes)
    save_checkpoint(tmp_path / "run", model, ByteTokenizer())
    save_hf_dir(model, tmp_path / "hf", ByteTokenizer())
    idx = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    for spec in (tmp_path / "run", tmp_path / "hf"):
        loaded = load(spec).model
        assert classes(loaded) <= CHAPTER, classes(loaded) - CHAPTER
        assert all(type(m) is nn.Linear for m in loaded.modules() if isinstance(m, nn.Linear))  # no subclass
        with torch.no_grad():
            torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=1e-5, atol=1e-5)


def test_a_gguf_file_loads_the_chapters_classes(tmp_path):
    from helpers.gguf import tiny_model, write_gguf

    write_gguf(tmp_path / "m.gguf", tiny_model())
    loaded = load(tmp_path / "m.gguf").model
    assert classes(loaded) <= CHAPTER, classes(loaded) - CHAPTER


def test_the_door_makes_the_model_fast_for_a_while_and_gives_it_back_bit_for_bit():
    from lumen.fast.packing import FastLinear

    model = tiny("baby-llama", n_kv_heads=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    idx = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))
    want = model.generate(idx, 12, temperature=0)
    with fast.decoding(model) as decoder:
        assert any(isinstance(m, FastLinear) for m in model.modules())
        assert torch.equal(decoder.generate(idx, 12, temperature=0), want)
    assert classes(model) <= CHAPTER
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert model.lm_head.weight is model.tok_emb.weight  # the tie survives


def imported_after(code: str) -> set[str]:
    """The lumen modules a fresh interpreter has imported after running code."""
    probe = textwrap.dedent(code) + "\nimport sys; print(' '.join(m for m in sys.modules if m.startswith('lumen')))"
    env = {"PYTHONPATH": str(CODE)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_doors_old_names_work_for_one_release_and_say_the_new_one():
    """lumen.fast.load_blocks and lumen.fast.stream (before "block" meant only a transformer block and "stream"
    only the residual stream) are load_quantized and tokens, each with a DeprecationWarning naming its new
    name; a name the door never had is an AttributeError."""
    for old, new in (("load_blocks", fast.load_quantized), ("stream", fast.tokens)):
        with pytest.warns(DeprecationWarning, match=rf"lumen\.fast\.{old} is now lumen\.fast\.{new.__name__}"):
            assert getattr(fast, old) is new
    with pytest.raises(AttributeError, match="no attribute 'load_gguf'"):
        fast.load_gguf  # noqa: B018


def test_loading_and_a_logit_lens_import_nothing_of_the_speed_wing(tmp_path):
    save_checkpoint(tmp_path / "run", tiny("baby-llama"), ByteTokenizer())
    found = imported_after(f"""
        import torch
        from lumen.formats import load
        from lumen.inspect import logit_lens
        m = load({str(tmp_path / "run")!r})
        logit_lens(m.model, torch.tensor([[1, 2, 3]]))
    """)
    assert "lumen.inspect.lens" in found and not {m for m in found if m.startswith("lumen.fast")}
    found = imported_after("import lumen.train, lumen.inspect, lumen.report, lumen.evaluate")
    assert not {m for m in found if m.startswith("lumen.fast")}
    assert "lumen.formats.gguf" not in found  # training reads no GGUF until a GGUF tokenizer is asked for
