"""The GGUF reader on small files written here with the `gguf` package, the way llama.cpp's converter
writes them: exact round trips, every quantization type `gguf` can write checked against Hugging Face's
own GGUF loader, and damaged or unsupported files rejected with a one-line error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from helpers.gguf import GGUF_NAMES, TOKENS, tiny_model, write_gguf
from lumen.formats import load
from lumen.formats.gguf import GGUFError, read_gguf


def hf_logits(hf_from_gguf, path, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_from_gguf(path)(ids).logits


IDS = torch.tensor([[5, 70, 3, 200, 17, 17, 99, 250, 1, 42, 8, 130]])


@pytest.mark.parametrize("tie", [True, False])
def test_f32_file_round_trips_exactly(tmp_path, tie):
    model = tiny_model(tie)
    write_gguf(tmp_path / "tiny.gguf", model)
    w = read_gguf(tmp_path / "tiny.gguf")
    cfg, state = w.cfg, w.state
    assert cfg.replace(name=model.cfg.name) == model.cfg
    for name, t in model.state_dict().items():
        if not (tie and name == "lm_head.weight"):  # a tied unembedding is stored once, as the embedding
            torch.testing.assert_close(state[name], t, rtol=0, atol=0, msg=name)
    assert ("lm_head.weight" in state) != tie
    loaded = load(tmp_path / "tiny.gguf").model
    assert (loaded.lm_head.weight is loaded.tok_emb.weight) == tie
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, rtol=0, atol=0)


def test_f32_file_matches_transformers(tmp_path, hf_from_gguf):
    """HF's GGUF loader undoes the Q/K permutation its own way: our logits must agree with its."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model(tie=False))
    loaded = load(str(path))
    ours, _ = loaded.model(IDS)
    torch.testing.assert_close(ours, hf_logits(hf_from_gguf, path, IDS), rtol=0, atol=1e-5)


def test_every_writable_quantization_matches_transformers(tmp_path, hf_from_gguf):
    """A file mixing F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 tensors gives HF's logits."""
    path = tmp_path / "mixed.gguf"
    kinds = [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
    names = [f"blk.{i}.{n}" for i in range(2) for n in GGUF_NAMES.values() if not n.endswith("norm.weight")]
    types = {name: kinds[j % len(kinds)] for j, name in enumerate(names)} | {"token_embd.weight": Q.Q8_0,
                                                                               "output.weight": Q.Q4_1}
    model = tiny_model(tie=False, seed=1)
    write_gguf(path, model, types)
    state = read_gguf(path).state
    assert not torch.equal(state["blocks.0.attn.k.weight"], model.blocks[0].attn.k.weight)  # really quantized
    ours, _ = load(str(path)).model(IDS)
    torch.testing.assert_close(ours, hf_logits(hf_from_gguf, path, IDS), rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen2", "gemma", "phi3", "qwen3moe"])
def test_other_architectures_round_trip(tmp_path, arch):
    """A "qwen2" file (q/k/v biases, rows not permuted), a "gemma" file (norm gains stored as 1 + g, heads
    wider than d_model / n_heads), a "phi3" file (W_Q, W_K, W_V fused, W_gate and W_up fused) and a "qwen3moe"
    file (experts stacked) read back as the model written, and compute its logits."""
    model = tiny_model(tie=arch == "gemma", seed=2, arch=arch)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, model, arch=arch)
    w = read_gguf(path)
    assert w.cfg.replace(name=model.cfg.name) == model.cfg
    for name, t in model.state_dict().items():
        if name != "lm_head.weight" or not model.cfg.tie_embeddings:  # 1 + g - 1 is g to float32 rounding
            torch.testing.assert_close(w.state[name], t, rtol=0, atol=0 if arch != "gemma" else 1.2e-7, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(load(str(path)).model(IDS)[0], model(IDS)[0], rtol=0, atol=1e-5)


def test_qwen2_file_matches_transformers(tmp_path, hf_from_gguf):
    """transformers reads a "qwen2" file its own way (no row permutation, biases): the same logits."""
    path = tmp_path / "qwen2.gguf"
    write_gguf(path, tiny_model(tie=False, seed=3, arch="qwen2"), arch="qwen2")
    ours, _ = load(str(path)).model(IDS)
    torch.testing.assert_close(ours, hf_logits(hf_from_gguf, path, IDS), rtol=0, atol=1e-5)


def test_tokenizer_from_metadata(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model())
    tok = read_gguf(path).tokenizer
    assert tok is not None
    ids = tok.encode("the the thin<|im_end|> a")  # merges apply in rank order; specials stay whole
    assert [TOKENS[i] for i in ids] == ["t", "he", "Ġthe", "Ġt", "h", "in", "<|im_end|>", "Ġa"]
    assert tok.decode(ids) == "the the thin<|im_end|> a"
    assert tok.eos_id == 2 and tok.chat_template.startswith("{% for m in messages %}")


def test_qwen2_pre_tokenizer_splits_as_qwen2(tmp_path):
    """tokenizer.ggml.pre "qwen2": the pieces are those of Qwen2's own split (transformers' regex for it)."""
    regex = pytest.importorskip("regex")
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    path = tmp_path / "qwen2.gguf"
    write_gguf(path, tiny_model(arch="qwen2"), arch="qwen2", pre="qwen2")
    tok = read_gguf(path).tokenizer
    text = "It's 12345 o'clock,  don't   PANIC!!\n\n  x2 = 3.14 ... über"
    pieces = [p for p, _ in tok.tok.pre_tokenizer.pre_tokenize_str(text)]
    byte_level = {b: c for b, c in enumerate(TOKENS[3:259])}  # (GPT-2's stand-ins for bytes)
    want = ["".join(byte_level[b] for b in piece.encode()) for piece in regex.findall(PRETOKENIZE_REGEX, text)]
    assert pieces == want


# --- bad input ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, tiny_model())
    return path


@pytest.mark.parametrize("keep", [0.5, 0.99, 0.02])
def test_truncated_file(tmp_path, tiny_file, keep):
    data = tiny_file.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GGUFError, match="truncated|not a readable GGUF") as e:
        read_gguf(bad)
    assert "\n" not in str(e.value) and "again" in str(e.value)


def test_corrupted_header(tmp_path, tiny_file):
    data = bytearray(tiny_file.read_bytes())
    data[0:4] = b"XXXX"  # the magic
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        read_gguf(bad)
    data = bytearray(tiny_file.read_bytes())
    data[24:32] = b"\xff" * 8  # the first key's length: absurd
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        read_gguf(bad)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "bert.gguf"
    write_gguf(path, tiny_model(), arch="bert")
    with pytest.raises(GGUFError, match="architecture 'bert' is not supported"):
        read_gguf(path)


def test_unsupported_quantization_type(tmp_path):
    """Q8_1 is a type the gguf package cannot dequantize."""
    model = tiny_model()
    path = tmp_path / "q81.gguf"
    write_gguf(path, model, {"blk.0.ffn_up.weight": Q.Q8_0})
    data = bytearray(path.read_bytes())
    # rewrite that tensor's type id in the header from Q8_0 to Q8_1 (blocks of 32 values, 36 bytes not 34)
    name = b"blk.0.ffn_up.weight"
    at = data.index(name) + len(name) + 4 + 8 * 2  # n_dims (u32), two u64 dims
    assert int.from_bytes(data[at : at + 4], "little") == Q.Q8_0
    data[at : at + 4] = int(Q.Q8_1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="Q8_1"):
        read_gguf(path)


def test_unknown_spec_lists_the_accepted_forms(tmp_path):
    with pytest.raises(ValueError, match="a .gguf file, a Hugging Face directory"):
        load("no-such-model")
    with pytest.raises(FileNotFoundError, match="no model at .*missing.gguf"):
        load(str(tmp_path / "missing.gguf"))


# --- one loader for every spec --------------------------------------------------------------------
def test_load_reads_every_spec_form_to_the_same_logits(tmp_path, tiny_file):
    """The same weights as a .gguf, as a Hugging Face directory (via `lumen convert`) and as a lumen
    checkpoint give identical logits and tokenizers."""
    from lumen.cli import main
    from lumen.formats.checkpoint import save_checkpoint

    first = load(str(tiny_file))
    assert main(["convert", str(tiny_file), "--to", "hf", str(tmp_path / "hf")]) == 0
    save_checkpoint(tmp_path / "run" / "checkpoints" / "step-000001", first.model, first.tokenizer)
    expected, _ = first.model(IDS)
    for spec in (tmp_path / "hf", tmp_path / "run", tmp_path / "run" / "checkpoints" / "step-000001"):
        other = load(str(spec))
        logits, _ = other.model(IDS)
        assert torch.equal(logits, expected), spec
        assert other.tokenizer.encode("the thin 12") == first.tokenizer.encode("the thin 12"), spec
        assert not other.model.training
    back = load(str(tmp_path / "hf"))
    assert back.tokenizer.eos_id == 2 and back.tokenizer.chat_template == first.tokenizer.chat_template


def test_load_in_bfloat16(tiny_file):
    m = load(str(tiny_file), dtype=torch.bfloat16).model
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    logits, _ = m(IDS)
    ref, _ = load(str(tiny_file)).model(IDS)
    assert (logits.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_cli_eval_and_generate_on_a_gguf_file(tmp_path, tiny_file, capsys):
    from lumen.cli import main

    text = tmp_path / "t.txt"
    text.write_text("the thin the thin in a the " * 20)
    assert main(["eval", str(tiny_file), "--text", str(text), "--context", "32"]) == 0
    out = capsys.readouterr().out
    assert "nats/token" in out and "perplexity" in out
    assert main(["generate", str(tiny_file), "--prompt", "the", "--max-new-tokens", "5", "--seed", "1",
                 "--temperature", "1"]) == 0
    assert capsys.readouterr().out.endswith("\n")
    bad = tmp_path / "bad.txt"
    bad.write_bytes("caf\u00e9 au lait\n".encode("latin-1"))  # text, but not UTF-8
    assert main(["eval", str(tiny_file), "--text", str(bad)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert main(["eval", str(tiny_file), "--text", str(text), "--context", "100"]) == 2
    assert "exceeds the model's context of 64" in capsys.readouterr().err


def test_unknown_tensor_is_an_error_not_ignored(tmp_path):
    """A tensor lumen has no place for (here a bias on W_Q) must stop the load, not be dropped silently."""
    path = tmp_path / "bias.gguf"
    write_gguf(path, tiny_model(), extra={"blk.1.attn_q.bias": np.zeros(64, dtype=np.float32)})
    with pytest.raises(GGUFError, match="blk.1.attn_q.bias has no place in lumen's 'llama' model"):
        read_gguf(path)
