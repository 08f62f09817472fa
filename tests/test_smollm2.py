"""The real SmolLM2-135M-Instruct, read from its GGUF file, against Hugging Face transformers reading the
same file: logits, evaluation loss, greedy continuations, token ids, and the CLI on top of them."""

from __future__ import annotations

import json
import unicodedata

import pytest
import torch

from lumen.cli import main
from lumen.evaluate import evaluate, windows
from lumen.formats import Loaded, chat_prompt, load

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, a little fox"]
TEXT = (
    "The quick brown fox jumps over the lazy dog. Transformers stack attention and MLP blocks, each adding "
    "its result to the residual stream. In 2024 the model read 12 books, wrote code like `x = [i**2 for i in "
    "range(10)]`, and answered questions about Paris, the capital of France, and Tokyo, the capital of Japan.\n"
)


@pytest.fixture
def use_fixture_model(monkeypatch, smollm2, smollm2_tokenizer):
    """Make `lumen ...` commands reuse the session's SmolLM2 instead of loading it again."""
    loaded = Loaded(smollm2, smollm2_tokenizer, "smollm2")

    def fake_load(spec, device="cpu", dtype=torch.float32):
        assert spec == "smollm2" and dtype == torch.float32
        return loaded

    monkeypatch.setattr("lumen.formats.load", fake_load)


def test_config_comes_from_the_metadata(smollm2):
    cfg = smollm2.cfg
    shape = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.hidden, cfg.vocab_size)
    assert shape == (30, 576, 9, 3, 1536, 49152)
    assert cfg.rope_theta == 100000.0 and cfg.tie_embeddings and cfg.mlp == "swiglu" and cfg.norm == "rmsnorm"
    assert abs(cfg.norm_eps - 1e-5) < 1e-10
    assert smollm2.lm_head.weight is smollm2.tok_emb.weight


@pytest.mark.smoke  # (this feature's real-model test in make test)
def test_logits_match_transformers(smollm2, smollm2_hf, smollm2_tokenizer):
    ids = torch.tensor([smollm2_tokenizer.encode(PROMPTS[0] + " Paris. " + PROMPTS[2])])
    with torch.no_grad():
        ours, _ = smollm2(ids)
        theirs = smollm2_hf(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-3


@pytest.mark.smoke  # (this feature's real-model test in make test)
def test_the_capital_of_france(smollm2, smollm2_tokenizer):
    ids = torch.tensor([smollm2_tokenizer.encode("The capital of France is")])
    nxt = smollm2.generate(ids, 1, temperature=0)[0, -1]
    assert smollm2_tokenizer.decode([int(nxt)]) == " Paris"


def test_greedy_continuations_match_transformers(smollm2, smollm2_hf, smollm2_tokenizer):
    eos = smollm2_tokenizer.eos_id
    for prompt in PROMPTS + [chat_prompt(smollm2_tokenizer, "What is the capital of France?")]:
        ids = torch.tensor([smollm2_tokenizer.encode(prompt)])
        ours = smollm2.generate(ids, 12, temperature=0)[0, ids.size(1):].tolist()
        theirs = smollm2_hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, pad_token_id=eos
        )[0, ids.size(1):].tolist()
        assert ours[: len(theirs)] == theirs, prompt
        assert len(theirs) == 12 or theirs[-1] == eos  # HF stops at the end-of-turn token; lumen's generate goes on


def test_compiled_decoding_matches_transformers(cpp_compiler, smollm2, smollm2_hf, smollm2_tokenizer):
    """The speed wing's compiled path (`lumen.fast.generate(..., compile=True)`: one-row products as fused sums
    over the float32 weights) still decodes HF's tokens."""
    from lumen import fast

    for prompt in PROMPTS[:2]:
        ids = torch.tensor([smollm2_tokenizer.encode(prompt)])
        ours = fast.generate(smollm2, ids, 12, temperature=0, compile=True)[0, ids.size(1):].tolist()
        theirs = smollm2_hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
            pad_token_id=smollm2_tokenizer.eos_id,
        )[0, ids.size(1):].tolist()
        assert ours[: len(theirs)] == theirs, prompt


# --- the tokenizer ------------------------------------------------------------------------------
TEXTS = [
    "Hello, world! How are you doing today?",
    "Ünïcödé — 日本語のテキスト, emoji 😀🚀, Ελληνικά, עברית, café naïve",
    "def f(x):\n    return {'a': x ** 2}  # square\n\n\n\tprint(f(3))\r\n",
    "a  b   c    d\t\te\n\n\n  f     ",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "In 2024, 12345 apples cost $3.50;  7 pears and x1 = ½ of ²",
]


def digit_pieces(text: str) -> list[str]:
    """llama.cpp's `smollm` pre-tokenizer first cuts every number character (\\p{N}) out on its own."""
    pieces, cur = [], ""
    for c in text:
        if unicodedata.category(c).startswith("N"):
            pieces += [cur, c] if cur else [c]
            cur = ""
        else:
            cur += c
    return pieces + ([cur] if cur else [])


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_matches_transformers(smollm2_tokenizer, smollm2_hf_tokenizer, text):
    """transformers' GGUF tokenizer skips the file's `smollm` pre-tokenizer (digits split first), so
    the exact reference is HF's BPE on llama.cpp's digit pieces; it equals HF's plain ids unless a
    run of whitespace precedes a digit (the last text: "  7")."""
    ours = smollm2_tokenizer.encode(text)
    hf = smollm2_hf_tokenizer
    reference = [i for piece in digit_pieces(text) for i in hf(piece, add_special_tokens=False).input_ids]
    assert ours == reference
    if text != TEXTS[-1]:
        assert ours == hf(text, add_special_tokens=False).input_ids
    assert smollm2_tokenizer.decode(ours) == text


def test_chat_template_matches_transformers(smollm2_tokenizer, smollm2_hf_tokenizer):
    msg = [{"role": "user", "content": "Name a prime."}]
    expected = smollm2_hf_tokenizer.apply_chat_template(msg, tokenize=False, add_generation_prompt=True)
    assert chat_prompt(smollm2_tokenizer, "Name a prime.") == expected
    assert smollm2_tokenizer.eos_id == smollm2_hf_tokenizer.convert_tokens_to_ids("<|im_end|>")


# --- evaluation ---------------------------------------------------------------------------------
def test_windows_cover_every_token_once():
    assert windows(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert windows(9, 4) == [(0, 4), (4, 8)]  # a one-token tail predicts nothing
    for n, c in [(1000, 64), (7, 7), (129, 32), (130, 32)]:
        spans = windows(n, c)
        assert all(b[0] == a[1] for a, b in zip(spans, spans[1:])) and spans[0][0] == 0
        assert all(e - s == c for s, e in spans[:-1])
        assert sum(e - s - 1 for s, e in spans) == n - -(-n // c)  # every token but each window's first


def test_eval_matches_transformers_loss(tmp_path, capsys, use_fixture_model, smollm2_hf, smollm2_tokenizer):
    """`lumen eval --json` against HF's own loss (labels=window) averaged over the same windows."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 2, encoding="utf-8")
    assert main(["eval", "smollm2", "--text", str(text), "--context", "64", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    ids = torch.tensor(smollm2_tokenizer.encode(TEXT * 2))
    total, scored = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), 64):
            w = ids[s : s + 64][None]
            if w.size(1) < 2:
                continue
            total += smollm2_hf(w, labels=w).loss.item() * (w.size(1) - 1)
            scored += w.size(1) - 1
    assert got["tokens"] == len(ids) and got["scored"] == scored and got["context"] == 64
    assert abs(got["loss"] - total / scored) / (total / scored) < 1e-4
    assert abs(got["perplexity"] - torch.tensor(total / scored).exp().item()) < 1e-3 * got["perplexity"]


def test_eval_rejects_a_context_longer_than_the_model(smollm2):
    with pytest.raises(ValueError, match="exceeds the model's 8192"):
        evaluate(smollm2, [1, 2, 3], context=9000)


# --- the CLI --------------------------------------------------------------------------------------
@pytest.mark.smoke  # (this feature's real-model test in make test)
def test_generate_streams_the_continuation(capsys, use_fixture_model):
    assert main(["generate", "smollm2", "--prompt", "The capital of France is", "--max-new-tokens", "2",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith(" Paris")


def test_generate_chat_matches_transformers(capsys, use_fixture_model, smollm2_hf, smollm2_hf_tokenizer):
    question = "What is the capital of France?"
    assert main(["generate", "smollm2", "--chat", "--prompt", question, "--max-new-tokens", "16", "--greedy"]) == 0
    ids = smollm2_hf_tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                   return_tensors="pt", return_dict=True)["input_ids"]
    out = smollm2_hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                              pad_token_id=2)[0, ids.size(1):].tolist()
    expected = smollm2_hf_tokenizer.decode([t for t in out if t != 2][: out.index(2) if 2 in out else None])
    assert capsys.readouterr().out == expected + "\n"


def test_sampling_is_seeded(capsys, use_fixture_model):
    args = ["generate", "smollm2", "--prompt", "Once", "--max-new-tokens", "6", "--temperature", "1.0",
            "--top-k", "50", "--top-p", "0.9", "--seed", "7"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first


def test_prompt_longer_than_the_context(capsys, use_fixture_model):
    assert main(["generate", "smollm2", "--prompt", "hello " * 8200, "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lumen generate: error:") and "context of 8192" in err and "\n" not in err


def test_convert_to_hf_loads_in_transformers_and_back(tmp_path, capsys, use_fixture_model, smollm2,
                                                      smollm2_tokenizer):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "smollm2-hf"
    assert main(["convert", "smollm2", "--to", "hf", str(out)]) == 0
    ids = torch.tensor([smollm2_tokenizer.encode(PROMPTS[0])])
    with torch.no_grad():
        ours, _ = smollm2(ids)
        back = load(str(out))
        again, _ = back.model(ids)
        hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
        theirs = hf(ids).logits
    assert torch.equal(again, ours)
    assert (theirs - ours).abs().max().item() < 1e-4
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok(TEXTS[-1], add_special_tokens=False).input_ids == smollm2_tokenizer.encode(TEXTS[-1])
    assert back.tokenizer.eos_id == smollm2_tokenizer.eos_id
    assert back.tokenizer.chat_template == smollm2_tokenizer.chat_template
    assert main(["convert", "smollm2", "--to", "hf", str(out)]) == 2  # never overwrites
    assert "not an empty directory" in capsys.readouterr().err


def bfloat16_copy(model):
    """A bf16 copy of the (float32) fixture model."""
    import copy

    return copy.deepcopy(model).to(torch.bfloat16)


def test_bfloat16_packed_model_still_knows_paris(smollm2, smollm2_tokenizer):
    """A bf16 model still answers, and its weights packed for oneDNN give the same tokens as plain bf16
    F.linear, with the unembedding (tied to the embedding) left plain."""
    from lumen.fast.packing import can_pack, fast_linears, packed

    plain = bfloat16_copy(smollm2)
    ids = torch.tensor([smollm2_tokenizer.encode("The capital of France is")])
    expected = plain.generate(ids, 4, temperature=0)
    assert smollm2_tokenizer.decode(expected[0, ids.size(1):ids.size(1) + 1].tolist()) == " Paris"
    if can_pack(plain):
        assert fast_linears(plain) == 30 * 7 + 1
        with packed(plain) as n:
            assert n == 30 * 7
            assert torch.equal(plain.generate(ids, 4, temperature=0), expected)


def test_compiled_bfloat16_decoding_is_no_less_accurate(cpp_compiler, smollm2, smollm2_tokenizer):
    """bf16 weights, decoded one token at a time: the compiled step (float32 sums, intermediates kept in
    float32 by the compiler) is at least as close to the float32 model's logits as the eager step."""
    from lumen import fast
    from lumen.attention import KVCache

    model = bfloat16_copy(smollm2)
    ids = torch.tensor([smollm2_tokenizer.encode("The capital of France is Paris, and the capital of Japan is")])
    with torch.inference_mode(), fast.decoding(model, compile=True) as decoder:
        seq = smollm2.generate(ids, 12, temperature=0)
        want = smollm2(seq)[0][:, ids.size(1) - 1:]  # the float32 model's logits at every decoded position
        errors = {}
        for name, step in (("eager", model), ("compiled", decoder.step)):
            cache = KVCache(model.cfg, 1, 256, dtype=torch.bfloat16)
            got = [model(ids, cache=cache)[0][:, -1]]  # the prompt, eager, as generate does
            got += [step(seq[:, t:t + 1], cache=cache)[0][:, -1] for t in range(ids.size(1), seq.size(1))]
            diff = (torch.stack(got, 1).float() - want).abs()
            errors[name] = (diff.max().item(), diff.mean().item())
    assert errors["compiled"][0] <= 1.1 * errors["eager"][0], errors
    assert errors["compiled"][1] <= 1.1 * errors["eager"][1], errors


def test_saved_tokenizer_keeps_eos_and_chat_template(smollm2_tokenizer, smollm2_hf_tokenizer, tmp_path):
    """What a run trained with the smollm2 tokenizer (or a converted model) saves and reloads:
    the same ids, the same end-of-sequence token, the same chat template as transformers reads."""
    from lumen.formats import chat_prompt
    from lumen.tokenizers import Tokenizer

    smollm2_tokenizer.save(tmp_path)
    back = Tokenizer.load(tmp_path)
    text = "Hello, wörld!  \n\tdef f(x): return 42"
    assert back.encode(text) == smollm2_tokenizer.encode(text)
    assert back.eos_id == smollm2_tokenizer.eos_id == smollm2_hf_tokenizer.eos_token_id
    msg = [{"role": "user", "content": "Hi"}]
    assert chat_prompt(back, "Hi") == smollm2_hf_tokenizer.apply_chat_template(msg, tokenize=False,
                                                                               add_generation_prompt=True)
