"""Decoding past the context (the sliding window) against a recompute-everything reference, sampling
defaults and their checks through the real `lumen generate` command, and which checkpoint it reads."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import pytest
import torch

from lumen import GPT, ModelConfig, fast
from lumen.cli import main
from lumen.decode import Sampling, sample_next
from lumen.formats.checkpoint import save_checkpoint
from lumen.tokenizers import ByteTokenizer

TINY = ModelConfig(vocab_size=256, context=16, d_model=32, n_layers=2, n_heads=4, dropout=0.0)


def tiny(positions: str, seed: int = 0, **changes) -> GPT:
    """A random model whose logits are far from ties (weights larger than the init's), so greedy
    tokens do not hinge on rounding."""
    torch.manual_seed(seed)
    model = GPT(TINY.replace(positions=positions, **changes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


@torch.no_grad()
def recompute_every_step(model: GPT, idx: torch.Tensor, n: int, choose) -> torch.Tensor:
    """The reference: at every step the whole forward pass over the last `context` tokens, no cache."""
    seq = idx
    for _ in range(n):
        logits, _ = model(seq[:, -model.cfg.context:])
        seq = torch.cat((seq, choose(logits[:, -1])[:, None]), dim=1)
    return seq


# --- the sliding window ------------------------------------------------------------------------------
@pytest.mark.parametrize("positions", ["learned", "rope"])
@pytest.mark.parametrize("prompt_len", [3, 16])
def test_greedy_decoding_past_the_context_equals_recomputing_the_window(positions, prompt_len):
    model = tiny(positions, n_kv_heads=2)
    idx = torch.randint(0, 256, (2, prompt_len), generator=torch.Generator().manual_seed(1))
    want = recompute_every_step(model, idx, 40, lambda z: z.argmax(-1))   # 40 new tokens, context 16
    got = model.generate(idx, 40, temperature=0)
    assert got.shape == (2, prompt_len + 40)
    assert torch.equal(got, want)
    assert torch.equal(model.generate(idx, 40, temperature=0, use_cache=False), want)


def test_sampling_past_the_context_draws_from_the_reference_distribution():
    model = tiny("learned", seed=3)
    idx = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(5)
    want = recompute_every_step(model, idx, 30, lambda z: sample_next(z, Sampling(0.8, top_p=0.95), gen))
    got = model.generate(idx, 30, temperature=0.8, top_p=0.95, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got, want)


@pytest.mark.slow  # compiling two graphs (the one-token step, the full window): ~1.5 min on 2 busy cores
def test_compiled_decoding_slides_too(cpp_compiler):
    model = tiny("rope", seed=6)
    idx = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(7))
    want = recompute_every_step(model, idx, 30, lambda z: z.argmax(-1))
    assert torch.equal(fast.generate(model, idx, 30, temperature=0, compile=True), want)


def test_sampling_settings_are_checked_before_decoding():
    model = tiny("learned")
    idx = torch.zeros(1, 3, dtype=torch.long)
    for bad in (float("nan"), -0.5, 1e-45, float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            model.generate(idx, 2, temperature=bad)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="top_p"):
            model.generate(idx, 2, top_p=bad)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(idx, 2, top_k=0)
    # the smallest accepted temperature on logits 100 apart: the softmax is one-hot, never NaN
    logits = torch.tensor([[0.0, 100.0, -50.0]])
    assert sample_next(logits, Sampling(1e-4, top_p=None), generator=torch.Generator().manual_seed(0)).item() == 1


# --- the command ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, GPT]:
    """A tiny byte-level model saved as a lumen checkpoint directory."""
    model = tiny("learned", seed=8)
    path = tmp_path_factory.mktemp("tiny") / "ckpt"
    save_checkpoint(path, model, ByteTokenizer())
    return path, model


def lumen(capsys, *args: str) -> tuple[int, str, str]:
    """The real command, in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def text_of(model: GPT, prompt: str, n: int, **kw) -> str:
    tok = ByteTokenizer()
    ids = model.generate(torch.tensor([tok.encode(prompt)]), n, **kw)[0, len(tok.encode(prompt)):]
    return tok.decode(ids.tolist())


def test_generate_command_samples_past_the_context_and_repeats_with_its_seed(saved, capsys):
    path, model = saved
    prompt = ["generate", str(path), "--prompt", "ROMEO:", "--max-new-tokens", "40"]  # 6 + 40 > context 16
    code, first, err = lumen(capsys, *prompt)
    assert code == 0, err
    # the defaults: sampling at temperature 0.8 and top-p 0.95, with the seed said on stderr
    assert "temperature 0.8, top-p 0.95" in err
    seed = int(err.split("--seed ")[1].split()[0])
    assert first == text_of(model, "ROMEO:", 40, temperature=0.8, top_p=0.95,
                            generator=torch.Generator().manual_seed(seed)) + "\n"
    assert lumen(capsys, *prompt, "--seed", str(seed))[:2] == (0, first)
    code, out, err = lumen(capsys, *prompt, "--greedy")
    assert code == 0 and "greedy decoding" in err
    assert out == text_of(model, "ROMEO:", 40, temperature=0) + "\n"


def test_generate_command_rejects_bad_sampling_settings_in_one_line(saved, capsys):
    path, _ = saved
    base = ["generate", str(path), "--prompt", "hi", "--max-new-tokens", "3"]
    cases = {
        ("--temperature", "nan"): "temperature",
        ("--temperature", "-1"): "temperature",
        ("--temperature", "1e-45"): "temperature",
        ("--top-p", "0"): "top_p",
        ("--top-p", "1.5"): "top_p",
        ("--seed", "1e23"): "--seed",
        ("--seed", str(10**23)): "--seed",
        ("--greedy", "--temperature=0.7"): "--greedy",
    }
    for case, word in cases.items():
        code, out, err = lumen(capsys, *base, *case)
        assert code == 2, (case, err)
        assert err.count("\n") == 1 and err.startswith("lumen generate: error:") and word in err, (case, err)
        assert "Traceback" not in err and out == ""


def test_generate_says_which_checkpoint_of_a_run_it_read(tmp_path, capsys):
    run = tmp_path / "run"
    best, latest = tiny("learned", seed=9), tiny("learned", seed=10)
    save_checkpoint(run / "checkpoints" / "step-1", best, ByteTokenizer())
    save_checkpoint(run / "checkpoints" / "step-2", latest, ByteTokenizer())
    (run / "best.json").write_text(json.dumps({"checkpoint": "step-1", "val_loss": 1.0}))
    assert main(["generate", str(run), "--prompt", "ab", "--max-new-tokens", "8", "--greedy"]) == 0
    got = capsys.readouterr()
    assert got.out == text_of(best, "ab", 8, temperature=0) + "\n"  # the best one's tokens
    note = got.err.splitlines()[0]
    assert "step-1" in note and "best" in note and "the latest is" in note and "step-2" in note


def test_generate_takes_the_defaults_of_a_generation_config(tmp_path, capsys):
    from lumen.formats import load
    from lumen.formats.hf import save_hf_dir

    model = tiny("learned", seed=11)
    save_hf_dir(model, tmp_path / "hf", ByteTokenizer())
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6,
                                                                         "top_k": 20, "top_p": 0.9}))
    args = ["generate", str(tmp_path / "hf"), "--prompt", "ab", "--max-new-tokens", "5", "--seed", "3"]
    assert main(args) == 0
    got = capsys.readouterr()
    assert "temperature 0.6, top-p 0.9, top-k 20" in got.err and "generation_config.json" in got.err
    assert got.out == text_of(model, "ab", 5, temperature=0.6, top_p=0.9, top_k=20,
                              generator=torch.Generator().manual_seed(3)) + "\n"
    # a Python caller of the loaded model gets the same defaults, through lumen.decode and through lumen.fast
    loaded = load(tmp_path / "hf").model
    assert loaded.sampling == Sampling(temperature=0.6, top_p=0.9, top_k=20)
    idx, g = torch.tensor([[97, 98]]), lambda: torch.Generator().manual_seed(3)  # noqa: E731
    want = model.generate(idx, 5, temperature=0.6, top_p=0.9, top_k=20, generator=g())
    assert torch.equal(loaded.generate(idx, 5, generator=g()), want)
    assert torch.equal(fast.generate(loaded, idx, 5, generator=g()), want)
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert main(args) == 0
    got = capsys.readouterr()
    assert "greedy decoding" in got.err and got.out == text_of(model, "ab", 5, temperature=0) + "\n"


def slowed(steps, seconds):
    """A decoder's token steps, each made `seconds` (a list, one per step; the last repeats) later."""
    for i, nxt in enumerate(steps):
        time.sleep(seconds[min(i, len(seconds) - 1)])
        yield nxt


def steady(err: str) -> tuple[int, float]:
    """(steps, tokens/s) of the steady rate lumen generate reports on stderr."""
    found = re.search(r"then (\d+) steps at ([\d.]+) tokens/s", err)
    assert found, err
    return int(found[1]), float(found[2])


def test_generate_reports_the_steady_rate_apart_from_the_first_steps(saved, capsys, monkeypatch):
    """Issue 39: compiling was counted in the rate ("0.1 tok/s"). With the prompt's pass and the two warm-up
    steps made 0.6 s slower (as compiling makes them) and every step at least 20 ms, the steady rate is the
    later steps' own: above 8 tokens/s where the old rate (all steps after the first) would be under 6."""
    path, _ = saved
    real = fast.Decoder.tokens
    monkeypatch.setattr(fast.Decoder, "tokens",
                        lambda self, *a, **k: slowed(real(self, *a, **k), [0.6, 0.6, 0.6, 0.02]))
    code, out, err = lumen(capsys, "generate", str(path), "--prompt", "ROMEO:", "--max-new-tokens", "12", "--greedy")
    assert code == 0, err
    n, rate = steady(err)
    assert n == 12 - 1 - 2 and 8 < rate <= 50
    first, warm = re.search(r"the prompt and first token ([\d.]+) s, the next 2 steps ([\d.]+) s", err).groups()
    assert float(first) >= 0.6 and float(warm) >= 1.2


@pytest.mark.parametrize("compiled_faster", [False, True])
def test_generate_compile_says_whether_it_was_slower_than_eager(saved, capsys, monkeypatch, compiled_faster):
    """--compile is compared with the eager path on a few steps: which one measured faster is said in one line.
    (The compiled path is stood in for by the eager one made slower, or the eager one slowed instead: no
    compiler is run here.)"""
    path, _ = saved
    real = fast.decoding
    slow = [0.0] if compiled_faster else [0.05]   # the "compiled" steps; the eager ones get the other
    other = [0.05] if compiled_faster else [0.0]

    @contextlib.contextmanager
    def pretend(model, compile=False):
        with real(model, False) as decoder:
            step, wait = decoder.step, (slow if compile else other)[0]

            def slow_step(*a, **k):
                time.sleep(wait)
                return step(*a, **k)

            decoder.step = slow_step
            yield decoder

    monkeypatch.setattr(fast, "decoding", pretend)
    code, _, err = lumen(capsys, "generate", str(path), "--prompt", "ROMEO:", "--max-new-tokens", "10", "--greedy",
                         "--compile")
    assert code == 0, err
    line = [w for w in err.splitlines() if "the eager path (no --compile)" in w]
    assert len(line) == 1, err
    assert ("--compile is faster" if compiled_faster else "--compile is slower") in line[0]
    assert "compiling included" in err
