"""GGUF files written by llama.cpp's own converter (convert_hf_to_gguf.py, from the llama-cpp-python sdist on
PyPI: tests/helpers/llama_cpp.py) from tiny random-weight Hugging Face models: lumen's reading of the file gives
transformers' logits on the original weights. Slow tier: each conversion starts the converter (~5 s)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
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

from helpers.llama_cpp import convert, save_tokenizer
from lumen.formats import load
from lumen.formats.gguf import GGUFError, read_gguf

pytestmark = pytest.mark.slow

V = 300  # at least the helper tokenizer's 264 tokens (helpers.gguf.TOKENS)
SHAPE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
MODELS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, rope_theta=50000.0)),
    "llama-tied-mha": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE | dict(num_key_value_heads=4),
                                                           tie_word_embeddings=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, rope_theta=1e6)),
    "qwen2-tied": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True)),
    "gemma-wide-heads": lambda: GemmaForCausalLM(GemmaConfig(**SHAPE | dict(num_key_value_heads=1), head_dim=32)),
    # the families of issue 35
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=32)),
    "olmo2": lambda: Olmo2ForCausalLM(Olmo2Config(**SHAPE, pad_token_id=0)),
    "phi3": lambda: Phi3ForCausalLM(Phi3Config(**SHAPE, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "phi2": lambda: PhiForCausalLM(PhiConfig(**SHAPE | dict(num_key_value_heads=4), partial_rotary_factor=0.5)),
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(  # llama.cpp scales queries by 1/sqrt(head_dim)
        **SHAPE, head_dim=16, query_pre_attn_scalar=16, sliding_window=5)),
    "smollm3": lambda: SmolLM3ForCausalLM(SmolLM3Config(**SHAPE, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(  # 7 blocks: the five-windowed-to-one-full rhythm, and more
        **SHAPE | dict(num_hidden_layers=7), head_dim=16, query_pre_attn_scalar=16, sliding_window=5)),
    "mixtral": lambda: MixtralForCausalLM(MixtralConfig(  # written as "llama" with stacked experts
        **SHAPE | dict(intermediate_size=32), num_local_experts=4, num_experts_per_tok=2)),
    "qwen3moe": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **SHAPE, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)),
    "olmoe": lambda: OlmoeForCausalLM(OlmoeConfig(  # (llama.cpp's OLMoE has as many key heads as query heads)
        **SHAPE | dict(num_key_value_heads=4, intermediate_size=32), num_experts=4, num_experts_per_tok=2)),
}
IDS = torch.tensor([[5, 70, 3, 200, 17, 17, 99, 250, 1, 42, 8, 130, 263, 7]])
# the noise floors: float32 files must agree to float32 rounding; a float16 file's weights are rounded to 11 bits,
# a q8_0 file's to 8 bits per block of 32 (measured on these models: ~1e-3 and ~1e-2 relative)
TOLERANCE = {"f32": 5e-5, "f16": 5e-3, "q8_0": 5e-2}


def relative(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


def hf_dir(tmp_path, kind: str, models=MODELS):
    torch.manual_seed(hash(kind) % 1000)
    model = models[kind]().eval()
    with torch.no_grad():  # norms away from their initial values, so a dropped or unfolded gain would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5) if "Gemma" in type(model).__name__ else p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / kind)
    save_tokenizer(tmp_path / kind, V)
    return model, tmp_path / kind


@pytest.mark.parametrize("kind", MODELS)
def test_converted_file_gives_transformers_logits(tmp_path, kind):
    model, directory = hf_dir(tmp_path, kind)
    path = convert(directory, tmp_path / f"{kind}.gguf")
    loaded = load(str(path)).model
    with torch.no_grad():
        ref = model(IDS).logits
        ours, _ = loaded(IDS)
    assert relative(ours, ref) < TOLERANCE["f32"], relative(ours, ref)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_converted_quantized_file_within_its_rounding(tmp_path, outtype):
    model, directory = hf_dir(tmp_path, "qwen2")
    path = convert(directory, tmp_path / f"qwen2-{outtype}.gguf", outtype)
    loaded = load(str(path)).model
    with torch.no_grad():
        err = relative(loaded(IDS)[0], model(IDS).logits)
    assert 0 < err < TOLERANCE[outtype], err  # (0: the file really is rounded)


def test_mistral_converts_to_llama_and_loads(tmp_path):
    """llama.cpp writes a Mistral as architecture "llama" (its W_Q/W_K permuted): lumen reads it exactly."""
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SHAPE))
    model.save_pretrained(tmp_path / "mistral")
    path = convert(tmp_path / "mistral", tmp_path / "mistral.gguf")
    with torch.no_grad():
        assert relative(load(str(path)).model(IDS)[0], model(IDS).logits) < TOLERANCE["f32"]


# (factor, low_freq_factor, high_freq_factor, original context, RoPE base): 2, 1, 1 (high 2) and 0 blended frequencies
LLAMA3 = [(8.0, 1.0, 4.0, 64, 10000.0), (32.0, 1.0, 4.0, 16, 50000.0), (8.0, 1.0, 2.0, 48, 500.0),
          (8.0, 1.0, 4.0, 5, 10000.0)]


@pytest.mark.parametrize("factor, low, high, original, theta", LLAMA3)
def test_llama3_rope_freqs_become_lumens_llama3_scaling(tmp_path, factor, low, high, original, theta):
    """Llama 3.1+'s rescaled RoPE reaches the file as the tensor rope_freqs.weight (each frequency's divisor):
    lumen's model of the file gives transformers' logits on the original, scaled, model, at positions past
    the original context."""
    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original}
    model = LlamaForCausalLM(LlamaConfig(**SHAPE | dict(max_position_embeddings=256), rope_parameters=rope)).eval()
    model.save_pretrained(tmp_path / "llama3")
    path = convert(tmp_path / "llama3", tmp_path / "llama3.gguf")
    w = read_gguf(path)
    assert w.cfg.rope_scaling is not None and w.cfg.rope_scaling.factor == factor
    ids = torch.randint(0, V, (1, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative(load(str(path)).model(ids)[0], model(ids).logits) < TOLERANCE["f32"]


def test_rope_freqs_no_llama3_scaling_reproduces_are_refused(tmp_path):
    """Divisors that no Llama 3 scaling produces (here: decreasing) are refused naming the tensor."""
    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters=rope)).save_pretrained(tmp_path / "llama3")
    path = convert(tmp_path / "llama3", tmp_path / "llama3.gguf")
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")  # the divisors reversed, in place
    freqs = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
    freqs.data[:] = freqs.data[::-1].copy()
    reader.data.flush()
    del reader
    with pytest.raises(GGUFError, match="rope_freqs.weight"):
        read_gguf(path)


# --- llama.cpp's own logits (llama-cpp-python: `make llama-cpp`), the second reference of `lumen verify` ----------
def llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        pytest.skip("llama-cpp-python is not installed (`make llama-cpp` builds it): no llama.cpp logits to compare")
    return llama_cpp


# llama.cpp runs Phi-2 with an MLP 4 d_model wide whatever the file says (its converter writes 4 d_model too)
LLAMA_CPP_MODELS = MODELS | {"phi2": lambda: PhiForCausalLM(PhiConfig(
    **SHAPE | dict(num_key_value_heads=4, intermediate_size=4 * SHAPE["hidden_size"]), partial_rotary_factor=0.5))}


@pytest.mark.parametrize("kind", LLAMA_CPP_MODELS)
def test_verify_against_llama_cpp_on_a_converted_file(tmp_path, capsys, kind):
    """`lumen verify` on the converter's float32 file: llama.cpp's logits (read here through llama-cpp-python,
    independently of lumen.formats.verify) are transformers' logits on the original weights to float32's floor
    (a GELU family's to the 16-bit one: llama.cpp's GELU is a float16 table), and the receipt's llama.cpp figures
    are lumen's logits against those."""
    import json

    from lumen.cli import main
    from lumen.formats.verify import FIXED_TEXT, LLAMA_CPP_FLOORS

    module = llama_cpp()
    model, directory = hf_dir(tmp_path, kind, LLAMA_CPP_MODELS)
    # (the file's general.name is the directory's: llama.cpp gives a model named "phi3" Phi-3's special tokens,
    # which the tests' tiny vocabulary lacks)
    directory = directory.rename(tmp_path / "tiny")
    path = convert(directory, tmp_path / f"{kind}.gguf")
    steps = 8
    assert main(["verify", str(path), "--steps", str(steps), "--json"]) in (0, 1)
    r = json.loads(capsys.readouterr().out)
    theirs = [c for c in r["comparisons"] if c["against"] == "llama.cpp"]
    assert len(theirs) == 1, r["notes"]
    c = theirs[0]
    ids = load(str(path)).tokenizer.encode(FIXED_TEXT)[: 64 - steps]
    llm = module.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True, verbose=False,
                       type_k=module.GGML_TYPE_F32, type_v=module.GGML_TYPE_F32)
    llm.eval(ids)
    theirs_logits = torch.from_numpy(llm.scores[: len(ids)].copy()).double()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].double()
        ours = load(str(path)).model(torch.tensor([ids]))[0][0].double()
    gelu = load(str(path)).model.cfg.activation.startswith("gelu")
    floor = LLAMA_CPP_FLOORS["16-bit" if gelu else "float32"]
    assert relative(theirs_logits, ref) < floor  # llama.cpp computes what transformers computes
    assert c["max_abs"] == pytest.approx(float((ours - theirs_logits).abs().max()), rel=1e-3, abs=1e-7)
    assert c["relative"] < floor and c["threshold"] == floor and c["greedy_must_agree"] != gelu and c["passed"], c
    if not gelu:
        assert c["greedy_lumen"] == c["greedy_reference"] and c["top1"] == 1.0


def test_verify_against_llama_cpp_on_rounded_files(tmp_path, capsys):
    """A float16 and a q8_0 file: llama.cpp rounds the activations too (to 16 bits; to 8 bits per block of 32),
    so its floor is the file's: within it, and (as measured) above float32's."""
    import json

    from lumen.cli import main
    from lumen.formats.verify import LLAMA_CPP_FLOORS

    llama_cpp()
    _, directory = hf_dir(tmp_path, "qwen2")
    for outtype, kind in (("f16", "16-bit"), ("q8_0", "quantized")):
        path = convert(directory, tmp_path / f"qwen2-{outtype}.gguf", outtype)
        assert main(["verify", str(path), "--steps", "4", "--json"]) == 0
        c = next(c for c in json.loads(capsys.readouterr().out)["comparisons"] if c["against"] == "llama.cpp")
        assert c["threshold"] == LLAMA_CPP_FLOORS[kind] and not c["greedy_must_agree"]
        assert 5e-5 < c["relative"] < LLAMA_CPP_FLOORS[kind], (outtype, c["relative"])
