"""`lumen verify`: its receipt on tiny random-weight Hugging Face models of several families and on a GGUF file
(exit 0, every figure equal to one computed here from transformers' and lumen's logits), a deliberately broken
lumen model (exit 1), and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTJConfig,
    GPTJForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PhiConfig,
    PhiForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

import lumen.formats
from helpers.gguf import MERGES, TOKENS, gguf_tensors, tiny_model, write_gguf
from lumen.cli import main
from lumen.formats.verify import FIXED_TEXT, LLAMA_CPP_FLOORS, matrix_kind

V = 300  # the helper tokenizer has 264 tokens
SHAPE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=96)
FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, num_key_value_heads=2)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, num_key_value_heads=2)),
    "gemma": lambda: GemmaForCausalLM(GemmaConfig(**SHAPE, num_key_value_heads=1, head_dim=32)),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=96)),
    "gpt_neox": lambda: GPTNeoXForCausalLM(GPTNeoXConfig(**SHAPE, rotary_pct=0.5)),
    # the families of issue 35
    "llama3": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, num_key_value_heads=2, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, num_key_value_heads=2, head_dim=32)),
    "qwen3_moe": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(**SHAPE, num_key_value_heads=2, head_dim=16, num_experts=4,
                                                            num_experts_per_tok=2, moe_intermediate_size=32)),
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**SHAPE, num_key_value_heads=2, head_dim=16, sliding_window=8)),
    "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(**SHAPE, num_key_value_heads=2, head_dim=16,
                                                         sliding_window=8)),
    "olmo2": lambda: Olmo2ForCausalLM(Olmo2Config(**SHAPE, num_key_value_heads=2, pad_token_id=0)),
    "phi3": lambda: Phi3ForCausalLM(Phi3Config(**SHAPE, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2)),
    "phi2": lambda: PhiForCausalLM(PhiConfig(**SHAPE)),
    "gptj": lambda: GPTJForCausalLM(GPTJConfig(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=96,
                                               rotary_dim=8)),
    "olmoe": lambda: OlmoeForCausalLM(OlmoeConfig(**SHAPE | dict(intermediate_size=32), num_key_value_heads=2,
                                                  num_experts=4, num_experts_per_tok=2, pad_token_id=0,
                                                  bos_token_id=None, eos_token_id=1)),
    "smollm3": lambda: SmolLM3ForCausalLM(SmolLM3Config(**SHAPE | dict(num_hidden_layers=4), num_key_value_heads=2,
                                                        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}
STEPS = 4


def save_tokenizer(directory) -> Tokenizer:
    """The helper byte-level BPE as a Hugging Face tokenizer.json beside the model."""
    merges = [tuple(m.split(" ")) for m in MERGES]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    return tok


def hf_dir(tmp_path, family: str):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    model.save_pretrained(tmp_path / family)
    return tmp_path / family, save_tokenizer(tmp_path / family)


def receipt(capsys, *args: str) -> tuple[int, dict]:
    code = main(["verify", *args, "--steps", str(STEPS), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out else {}


# the default tier checks one family (each takes ~5 s on a busy machine); the slow tier every one
@pytest.mark.parametrize("family", [f if f == "llama" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_receipt_passes_and_its_figures_are_right(tmp_path, capsys, family):
    directory, tok = hf_dir(tmp_path, family)
    text = tmp_path / "mine.txt"
    text.write_text("the thin heat in a tent; the end")
    code, r = receipt(capsys, str(directory), "--text", str(text))
    assert code == 0 and r["passed"] and r["dtype"] == "float32"
    assert [c["text"] for c in r["comparisons"]] == ["built-in text", str(text)]
    # every figure again, from the two libraries' logits computed here
    moe = family in ("qwen3_moe", "olmoe")
    eager = {"experts_implementation": "eager"} if moe else {}  # (grouped_mm has no float64)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64, **eager).eval()
    ours = lumen.formats.load(str(directory), dtype=torch.float64).model
    for c, words in zip(r["comparisons"], [FIXED_TEXT, text.read_text()]):
        ids = torch.tensor([tok.encode(words).ids])
        assert c["text_tokens"] == ids.shape[1]
        ids = ids[:, : 96 - STEPS]  # the context less the steps
        assert c["tokens"] == ids.shape[1]
        with torch.no_grad():
            p, q = hf(ids).logits[0], ours(ids)[0][0]
        assert c["max_abs"] < 1e-4 and c["relative"] < 5e-5  # float32 against float64's answer
        kl = torch.nn.functional.kl_div(q.log_softmax(-1), p.log_softmax(-1), log_target=True, reduction="sum")
        assert c["kl"] == pytest.approx(float(kl) / ids.shape[1], abs=1e-9)
        assert c["top1"] == 1.0 == float((p.argmax(-1) == q.argmax(-1)).double().mean())
        seq = ids
        with torch.no_grad():
            for _ in range(STEPS):
                seq = torch.cat([seq, hf(seq).logits[:, -1:].argmax(-1)], 1)
        assert c["greedy_lumen"] == c["greedy_reference"] == seq[0, ids.shape[1]:].tolist()
        assert c["continuation"] == tok.decode(c["greedy_lumen"])


def test_text_receipt_and_bfloat16(tmp_path, capsys):
    directory, _ = hf_dir(tmp_path, "llama")
    assert main(["verify", str(directory), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "relative error" in out and "within" in out and out.rstrip().endswith("what transformers computes")
    code, r = receipt(capsys, str(directory), "--dtype", "bfloat16")
    assert code == 0 and r["comparisons"][0]["threshold"] == 1e-2
    assert 5e-5 < r["comparisons"][0]["relative"] < 1e-2  # really bfloat16: not float32's agreement


def test_gguf_file_is_checked_against_transformers_reading_of_it(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model(tie=False))
    code, r = receipt(capsys, str(path))
    assert code == 0 and r["reference"].endswith("(gguf_file=)")
    assert r["comparisons"][0]["relative"] < 5e-5


def test_a_broken_lumen_model_fails(tmp_path, capsys, monkeypatch):
    """One weight of lumen's model changed after loading: the receipt must say FAIL and exit 1."""
    directory, _ = hf_dir(tmp_path, "qwen2")
    load = lumen.formats.load

    def broken(*args, **kwargs):
        loaded = load(*args, **kwargs)
        with torch.no_grad():
            loaded.model.blocks[1].attn.v.weight[3, 5] += 0.05
        return loaded

    monkeypatch.setattr(lumen.formats, "load", broken)
    code, r = receipt(capsys, str(directory))
    assert code == 1 and not r["passed"]
    assert 5e-5 < r["comparisons"][0]["relative"] < 1e-1
    assert main(["verify", str(directory), "--steps", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # (with llama.cpp a GGUF transformers cannot read is verified)
    directory, _ = hf_dir(tmp_path, "llama")
    cases = [
        ([str(tmp_path / "nothing")], "no model at"),
        ([str(directory), "--text", str(tmp_path / "missing.txt")], "no such file"),
        ([str(directory), "--steps", "-1"], "--steps must be at least 0"),
        ([str(directory), "--steps", "96"], "steps must be between 0 and 95"),
    ]
    gemma = tmp_path / "gemma.gguf"  # transformers reads no GGUF of architecture "gemma": nothing to compare with
    write_gguf(gemma, tiny_model(tie=True, arch="gemma"), arch="gemma")
    cases.append(([str(gemma)], "cannot read this GGUF architecture"))
    phi3 = tmp_path / "phi3.gguf"  # transformers' GGUF reading of Phi-3 takes its pad id 32000 past this vocabulary
    write_gguf(phi3, tiny_model(tie=False, arch="phi3"), arch="phi3")
    cases.append(([str(phi3)], "cannot read this GGUF file (AssertionError"))
    cases.append(([str(directory)], "has no tokenizer"))
    capsys.readouterr()  # (transformers' progress bar while saving)
    for args, message in cases:
        if message == "has no tokenizer":
            (directory / "tokenizer.json").unlink()
        assert main(["verify", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    assert main(["verify", str(gemma)]) == 2
    assert "pip install 'lumen-lm[verify]'" in capsys.readouterr().err


# --- llama.cpp's logits as a second reference for a GGUF file -------------------------------------------------
class FakeLlama:
    """llama-cpp-python's `Llama` as lumen.formats.verify drives it (the constructor's arguments, reset, eval,
    scores, n_tokens): logits from lumen's model of the file in float64, plus `shift` at every position (a
    stand-in for llama.cpp's own arithmetic), recomputed over every token seen at each eval."""

    shift: torch.Tensor | None = None
    made: list[dict] = []

    def __init__(self, model_path: str, **kwargs):
        FakeLlama.made.append(kwargs)
        assert kwargs["logits_all"] and kwargs["type_k"] == kwargs["type_v"] == 0  # (float32 KV cache)
        self.model = lumen.formats.load(model_path, dtype=torch.float64).model
        self.scores = np.zeros((kwargs["n_ctx"], self.model.cfg.vocab_size), np.float32)
        self.seen: list[int] = []
        self.n_tokens = 0

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens) -> None:
        self.seen = self.seen[: self.n_tokens] + list(tokens)
        with torch.no_grad():
            logits = self.model(torch.tensor([self.seen]))[0][0]
        if FakeLlama.shift is not None:
            logits = logits + FakeLlama.shift
        self.scores[: len(self.seen)] = logits.numpy()
        self.n_tokens = len(self.seen)


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    FakeLlama.shift, FakeLlama.made = None, []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama, GGML_TYPE_F32=0,
                                                                        __version__="fake"))
    return FakeLlama


def llama_cpp_figures(path, ids: list[int], shift, steps: int = STEPS):
    """The llama.cpp comparison's figures computed here: lumen's float32 logits against float64 + shift, and
    the greedy tokens of float64 + shift."""
    ours = lumen.formats.load(str(path)).model
    exact = lumen.formats.load(str(path), dtype=torch.float64).model
    with torch.no_grad():
        q = ours(torch.tensor([ids]))[0][0].double()
        p = (exact(torch.tensor([ids]))[0][0] + (0 if shift is None else shift)).float().double()
        seq = list(ids)
        for _ in range(steps):
            seq.append(int((exact(torch.tensor([seq]))[0][0, -1] + (0 if shift is None else shift)).argmax()))
    kl = torch.nn.functional.kl_div(q.log_softmax(-1), p.log_softmax(-1), log_target=True, reduction="sum")
    return dict(max_abs=float((p - q).abs().max()), relative=float((p - q).abs().max() / p.abs().max()),
                kl=float(kl) / len(ids), top1=float((p.argmax(-1) == q.argmax(-1)).double().mean()),
                greedy=seq[len(ids):])


def gguf_ids(path, text: str = FIXED_TEXT) -> list[int]:
    return lumen.formats.load(str(path)).tokenizer.encode(text)[: 64 - STEPS]


@pytest.mark.parametrize("size, passes", [(0.0, True), (1e-2, False)])
def test_llama_cpp_comparison_figures_on_a_float32_file(tmp_path, capsys, fake_llama_cpp, size, passes):
    """A float32 file: llama.cpp's floor is float32's, the greedy tokens must agree; a shift of 1e-2 (relative
    ~5e-3) fails the llama.cpp comparison alone, and the receipt with it (exit 1)."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model(tie=False))
    ids = gguf_ids(path)
    fake_llama_cpp.shift = size * torch.linspace(-1, 1, len(TOKENS), dtype=torch.float64)
    code, r = receipt(capsys, str(path))
    assert code == (0 if passes else 1) and r["passed"] == passes and r["notes"] == []
    assert [c["against"] for c in r["comparisons"]] == ["transformers", "llama.cpp"]
    theirs = r["comparisons"][1]
    want = llama_cpp_figures(path, ids, fake_llama_cpp.shift)
    for key in ("max_abs", "relative", "kl", "top1"):
        assert theirs[key] == pytest.approx(want[key], rel=1e-6, abs=1e-12), key
    assert theirs["greedy_reference"] == want["greedy"] and theirs["greedy_lumen"] == r["comparisons"][0][
        "greedy_lumen"]
    assert theirs["threshold"] == 5e-5 and theirs["greedy_must_agree"] and theirs["passed"] == passes
    assert r["comparisons"][0]["passed"]  # transformers' comparison is untouched by llama.cpp's
    assert fake_llama_cpp.made[0]["n_ctx"] == len(ids) + STEPS  # room for the longest text and its steps


def test_llama_cpp_floor_follows_the_files_matrices(tmp_path, capsys, fake_llama_cpp):
    """A file of Q8_0 matrices: llama.cpp rounds the activations to 8 bits, so the floor is the quantized one
    and the greedy tokens are reported, not required; the same shift that fails a float32 file passes here."""
    model = tiny_model(tie=False)
    path = tmp_path / "q8.gguf"
    write_gguf(path, model, types={n: Q.Q8_0 for n in gguf_tensors(model) if n.endswith(("_q.weight", "up.weight",
                                                                                           "output.weight"))})
    assert matrix_kind(path) == "quantized"
    fake_llama_cpp.shift = 1e-2 * torch.linspace(-1, 1, len(TOKENS), dtype=torch.float64)
    code, r = receipt(capsys, str(path))
    theirs = r["comparisons"][1]
    assert code == 0 and theirs["threshold"] == LLAMA_CPP_FLOORS["quantized"] and not theirs["greedy_must_agree"]
    assert 5e-5 < theirs["relative"] < LLAMA_CPP_FLOORS["quantized"]
    assert main(["verify", str(path), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "against llama.cpp" in out and "KL(llama.cpp‖lumen)" in out
    assert out.rstrip().endswith("PASS: lumen computes what transformers and llama.cpp compute")


def test_matrix_kind(tmp_path):
    model = tiny_model(tie=True)
    cases = [({}, "float32"), ({"blk.0.ffn_up.weight": Q.F16}, "16-bit"), ({"blk.1.attn_v.weight": Q.BF16}, "16-bit"),
             ({"blk.1.attn_v.weight": Q.Q4_0, "blk.0.ffn_up.weight": Q.F16}, "quantized"),
             ({"token_embd.weight": Q.F16}, "16-bit")]  # tied: the embedding is the unembedding too
    for i, (kinds, want) in enumerate(cases):
        write_gguf(tmp_path / f"{i}.gguf", model, types=kinds)
        assert matrix_kind(tmp_path / f"{i}.gguf") == want, kinds
    write_gguf(tmp_path / "untied.gguf", tiny_model(tie=False), types={"token_embd.weight": Q.F16})
    assert matrix_kind(tmp_path / "untied.gguf") == "float32"  # only looked up


def test_without_transformers_reading_llama_cpp_alone(tmp_path, capsys, fake_llama_cpp):
    """transformers reads no "gemma" GGUF: with llama.cpp there is still a reference, and a note says which
    one is missing and why."""
    path = tmp_path / "gemma.gguf"
    write_gguf(path, tiny_model(tie=True, arch="gemma"), arch="gemma")
    code, r = receipt(capsys, str(path))
    assert code == 0 and [c["against"] for c in r["comparisons"]] == ["llama.cpp"]
    # a float32 file, but Gemma's GELU: llama.cpp reads it from a float16 table, so the 16-bit floor
    (c,) = r["comparisons"]
    assert c["threshold"] == LLAMA_CPP_FLOORS["16-bit"] and not c["greedy_must_agree"]
    assert len(r["notes"]) == 1 and "transformers: not compared" in r["notes"][0]
    assert "cannot read this GGUF architecture" in r["notes"][0]
    assert r["comparisons"][0]["relative"] == pytest.approx(llama_cpp_figures(path, gguf_ids(path), None)["relative"],
                                                            rel=1e-6, abs=1e-12)


def test_llama_cpp_missing_or_refusing_is_a_note(tmp_path, capsys, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model(tie=False))
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # not installed
    code, r = receipt(capsys, str(path))
    assert code == 0 and [c["against"] for c in r["comparisons"]] == ["transformers"]
    assert r["notes"] == ["llama.cpp: not compared (llama-cpp-python is not installed: pip install "
                          "'lumen-lm[verify]')"]

    def refuses(model_path, **_):
        raise ValueError(f"Failed to load model from file: {model_path}")

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=refuses, GGML_TYPE_F32=0,
                                                                        __version__="9.9"))
    code, r = receipt(capsys, str(path))
    assert code == 0 and len(r["comparisons"]) == 1
    assert r["notes"][0].startswith("llama.cpp: not compared (llama-cpp-python 9.9 cannot load tiny.gguf: "
                                    "ValueError: Failed to load model")


@pytest.mark.slow
def test_smollm2_receipt_against_transformers_and_llama_cpp(smollm2_gguf, capsys):
    """`lumen verify smollm2`: transformers' reading of the Q4_1 file to float32's floor; llama.cpp's (when
    llama-cpp-python is installed) within the quantized floor, its activations rounded to 8 bits."""
    code = main(["verify", "smollm2", "--steps", "8", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["passed"]
    hf, *rest = r["comparisons"]
    assert hf["against"] == "transformers" and hf["relative"] < 5e-5 and hf["greedy_lumen"] == hf["greedy_reference"]
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        assert rest == [] and "not installed" in r["notes"][0]
        pytest.skip("llama-cpp-python is not installed (`make llama-cpp` builds it): transformers' half checked")
    (theirs,) = rest
    assert theirs["against"] == "llama.cpp" and theirs["threshold"] == LLAMA_CPP_FLOORS["quantized"]
    assert 5e-5 < theirs["relative"] < LLAMA_CPP_FLOORS["quantized"] and theirs["top1"] > 0.9
