"""The decoding step compiled ahead of time (`lumen.fast.decoding(model, compile="aot")`, fast/aot.py): its
greedy tokens are the plain path's (lumen.decode), past the context too; its package holds code, not weights
(a second model of the same shape shares it and decodes its own tokens; a second loader only loads it); from
a GGUF's blocks it decodes as the block path does (the tolerances of tests/test_quant.py's block tests)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lumen import GPT, ModelConfig, fast
from lumen.attention import KVCache
from lumen.decode import generate
from lumen.errors import UserError
from lumen.fast import aot

# RoPE, grouped-query heads, SwiGLU, RMSNorm: SmolLM2's family, small
TINY = ModelConfig.from_name("baby-llama").replace(vocab_size=97, context=40, d_model=64, n_layers=2, n_heads=4,
                                                   n_kv_heads=2, d_ff=128)


def tiny(seed: int) -> GPT:
    """A random model whose logits are far from ties (weights larger than the init's), so greedy tokens do
    not hinge on rounding."""
    torch.manual_seed(seed)
    model = GPT(TINY).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def test_aot_is_chosen_by_name_and_a_prompt_runs_the_model_as_it_is(monkeypatch):
    model, idx = tiny(0), torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(UserError, match="compile must be one of False, True, 'aot', got 'jit'"):
        with fast.decoding(model, compile="jit"):
            pass
    monkeypatch.setattr(aot, "build", lambda *a: pytest.fail("a prompt needs no package"))
    with torch.inference_mode(), fast.decoding(model, compile="aot") as decoder:
        cache = KVCache(model.cfg, 1, 16)
        logits, _ = decoder.step(idx, cache=cache)
        assert cache.n == 4
    with torch.inference_mode():
        torch.testing.assert_close(logits, model(idx)[0], rtol=1e-5, atol=1e-5)


def test_the_step_as_written_runs_the_model_with_a_cache_its_constructor_made():
    """OneTokenStep (what torch.export traces) gives the model's logits for one token and writes the token's
    key and value into the input tensors, in place; its cache has every attribute KVCache's constructor gives
    one (nothing set by hand that a new field of KVCache would miss)."""
    model, idx = tiny(0), torch.tensor([[5, 17, 3, 42]])
    step = aot.OneTokenStep(model)
    assert set(vars(step.cache)) == set(vars(KVCache(model.cfg, 1, 8)))
    with torch.inference_mode():
        ours, plain = KVCache(model.cfg, 1, 16), KVCache(model.cfg, 1, 16)
        model(idx, cache=ours), model(idx, cache=plain)
        x = torch.tensor([[7]])
        logits = step(x, ours.length, [layer.k for layer in ours.layers], [layer.v for layer in ours.layers])
        want, _ = model(x, cache=plain)
    torch.testing.assert_close(logits, want, rtol=1e-6, atol=1e-6)
    assert ours.n == plain.n == 5
    for a, b in zip(ours.layers, plain.layers):
        torch.testing.assert_close(a.k, b.k, rtol=1e-6, atol=1e-6)


def test_the_package_key_follows_every_source_the_step_reaches_and_no_other(tmp_path):
    """The key comes from the step's own sources, found through its modules' classes and their imports: the
    wing's swapped-in classes (found, not listed) are among them; in a copy of lumen, a change to config.py
    (no module of the step is defined there: the model's code reaches it by import) gives a new key, a change
    to the training loop (which the step never reaches) the same one."""
    import shutil
    from pathlib import Path

    import lumen

    with fast.decoding(tiny(0)) as decoder:
        names = {p.relative_to(Path(lumen.__file__).parent).as_posix() for p in aot.step_sources(decoder.model)}
    assert {"model.py", "block.py", "attention.py", "config.py", "fast/attention.py", "fast/packing.py",
            "fast/aot.py", "fast/kernels.py", "fast/quads.py", "fast/quant.cpp", "fast/quads.h",
            "fast/attend.cpp"} <= names
    assert "train/loop.py" not in names
    shutil.copytree(Path(lumen.__file__).parent, tmp_path / "lumen", ignore=shutil.ignore_patterns("__pycache__"))
    child = f"""
import torch
from pathlib import Path
from lumen import GPT, ModelConfig, fast
from lumen.fast import aot
model = GPT(ModelConfig.from_name("baby-llama").replace(vocab_size=97, context=40, d_model=64, n_layers=2,
                                                        n_heads=4, n_kv_heads=2, d_ff=128))
root = Path({str(tmp_path / "lumen")!r})
assert Path(aot.__file__).parent.parent == root  # (the copy, not the worktree)
with fast.decoding(model):
    keys = [aot.package_path(model, 1, 256).name]
    for name in ("train/loop.py", "config.py"):
        with open(root / name, "a") as f:
            f.write("\\n# changed\\n")
        keys.append(aot.package_path(model, 1, 256).name)
print(*keys)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    first, after_loop, after_config = out.stdout.split()
    assert after_loop == first and after_config != first


@pytest.mark.slow
def test_a_later_process_only_loads_the_package_and_never_imports_the_compiler(tmp_path, monkeypatch,
                                                                               cpp_compiler):
    """Decoding a GGUF's blocks (a tiny file whose matrices are all Q8_0 or Q4_1, as SmolLM2's): once a
    package exists, a new process decodes the same greedy tokens through it without importing torch's
    compiler (dynamo and inductor: ~65 MiB of resident memory each time they are imported)."""
    from gguf import GGMLQuantizationType as Q

    from helpers.gguf import tiny_model, write_gguf

    monkeypatch.setenv("LUMEN_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    matrices = [f"blk.{i}.{m}.weight" for i in range(2) for m in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                  "ffn_gate", "ffn_up", "ffn_down")]
    write_gguf(path, tiny_model(), {"token_embd.weight": Q.Q8_0} | {m: Q.Q4_1 for m in matrices})
    model = fast.load_quantized(str(path)).model
    idx = torch.tensor([[5, 9, 2, 30]])
    want = fast.generate(model, idx, 40, temperature=0, compile="aot")[0].tolist()
    child = f"""
import sys, torch
from lumen import fast
from lumen.fast import aot
aot.build = None  # (nothing to build: calling it fails)
model = fast.load_quantized({str(path)!r}).model
print(fast.generate(model, torch.tensor({idx.tolist()}), 40, temperature=0, compile="aot")[0].tolist())
print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "LUMEN_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-2000:]
    tokens, compiler = out.stdout.strip().splitlines()[-2:]
    assert tokens == str(want) and compiler == "[]"


@pytest.mark.slow
def test_aot_decodes_the_plain_greedy_tokens_and_its_package_holds_no_weights(tmp_path, monkeypatch, cpp_compiler):
    """Greedy decoding through the package equals lumen.decode's, 60 tokens past a 40-token context (the
    window re-read by the model itself); another model of the same shape finds the same package and decodes
    its own weights' tokens; a second loader (as a later process) builds nothing and gives the same logits,
    bit for bit."""
    monkeypatch.setenv("LUMEN_CACHE", str(tmp_path / "cache"))
    idx = torch.tensor([[5, 17, 3, 42]])
    first, second = tiny(0), tiny(1)
    with torch.inference_mode():
        want = [generate(m, idx, 60, temperature=0) for m in (first, second)]
    assert not torch.equal(want[0], want[1])  # (the two models decode differently)
    for model, tokens in zip((first, second), want):
        assert torch.equal(fast.generate(model, idx, 60, temperature=0, compile="aot"), tokens)
    assert len(list((tmp_path / "cache" / "steps").glob("*.pt2"))) == 1  # one shape, one package

    monkeypatch.setattr(aot, "build", lambda *a: pytest.fail("the package exists: nothing to build"))
    with torch.inference_mode(), fast.decoding(first, compile="aot") as decoder:
        again = aot.AOTStep(first)
        caches = [KVCache(first.cfg, 1, first.cfg.context) for _ in range(3)]  # (the slots generate used)
        for c in caches:
            first(idx, cache=c)
        for t in (7, 11, 2):
            x = torch.tensor([[t]])
            ours, theirs, plain = decoder.step(x, cache=caches[0]), again(x, cache=caches[1]), first(x, cache=caches[2])
            assert torch.equal(ours[0], theirs[0]) and caches[0].n == caches[1].n == caches[2].n
            torch.testing.assert_close(ours[0], plain[0], rtol=1e-5, atol=1e-5)
        for a, b in zip(caches[0].layers, caches[2].layers):  # the keys and values it wrote in place
            torch.testing.assert_close(a.k, b.k, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.v, b.v, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_smollm2_from_its_blocks_decodes_through_the_package_as_the_block_path(smollm2, smollm2_tokenizer,
                                                                               cpp_compiler):
    """SmolLM2's Q4_1 file kept as blocks, decoded through the package (quant.cpp's product called as a C
    function): along the float model's greedy continuation, each step's distribution within a mean KL of
    0.03 nats of the float model's and the same top token at >= 85% of 48 steps (test_quant.py's bounds for
    the block path), and the first 4 greedy tokens the float model's."""
    from lumen.fast import load_quantized

    model = load_quantized("smollm2").model
    ids = torch.tensor([smollm2_tokenizer.encode("The capital of France is")])
    with torch.inference_mode():
        want = smollm2.generate(ids, 48, temperature=0)
        reference = smollm2(want)[0][0, ids.size(1) - 1:-1].log_softmax(-1)
        with fast.decoding(model, compile="aot") as decoder:
            cache = KVCache(model.cfg, 1, 256)
            steps = [model(ids, cache=cache)[0][0, -1]]
            for t in want[0, ids.size(1):-1]:
                steps.append(decoder.step(t.view(1, 1), cache=cache)[0][0, -1])
        got = torch.stack(steps).log_softmax(-1)
        kl = (reference.exp() * (reference - got)).sum(-1)
        assert float(kl.mean()) < 0.03
        assert float((got.argmax(-1) == reference.argmax(-1)).float().mean()) >= 0.85
    tokens = fast.generate(model, ids, 8, temperature=0, compile="aot")
    assert torch.equal(tokens[:, : ids.size(1) + 4], want[:, : ids.size(1) + 4])
