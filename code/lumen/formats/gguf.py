"""llama.cpp's GGUF files: hyper-parameters from the metadata, tensors dequantized to float32 by the
`gguf` package, mapped onto lumen's Llama-family model; the tokenizer rebuilt as a `tokenizers` BPE.

    >>> cfg, state, tok = read_gguf(fetch("smollm2"))     # doctest: +SKIP
    >>> model = GPT.from_state(cfg, state)                 # doctest: +SKIP

Two things in a GGUF differ from the checkpoint it was converted from:
- llama.cpp rotates (x[2i], x[2i+1]) pairs with RoPE, Hugging Face (and lumen) rotate (x[i], x[i + hd/2]);
  so the converter permuted the rows of W_Q and W_K within each head. `unpermute` puts them back.
- tied embeddings: the file stores the embedding once and has no `output.weight`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import ModelConfig
from ..errors import MissingFileError, ModelFileError
from ..model import GPT
from ..tokenizers import HFTokenizer

# GGUF tensor name (inside block i) -> lumen parameter name
_BLOCK = {
    "attn_norm.weight": "ln1.g",
    "attn_q.weight": "attn.q.weight",
    "attn_k.weight": "attn.k.weight",
    "attn_v.weight": "attn.v.weight",
    "attn_output.weight": "attn.out.weight",
    "ffn_norm.weight": "ln2.g",
    "ffn_gate.weight": "mlp.w_gate.weight",
    "ffn_up.weight": "mlp.w_up.weight",
    "ffn_down.weight": "mlp.w_down.weight",
}
_TOP = {"token_embd.weight": "tok_emb.weight", "output_norm.weight": "ln_f.g", "output.weight": "lm_head.weight"}

ARCHITECTURES = ("llama",)  # GGUF architectures lumen's model can hold exactly

# llama.cpp's pre-tokenizer names -> how text is split before BPE (tokenizer.ggml.pre)
_GPT2_SPLIT = ("gpt2", "default", "mpt", "olmo", "jais")
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3")
PRE_TOKENIZERS = _GPT2_SPLIT + _DIGITS_THEN_GPT2 + _LLAMA3_SPLIT

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types for special and added tokens


class GGUFError(ModelFileError):
    """A GGUF file lumen cannot read: the message says what is wrong and what to do."""


# ---------------------------------------------------------------------------------------------
# the file
def open_gguf(path: str | Path):
    """A `gguf.GGUFReader` over the file, with every tensor checked to lie inside it."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no GGUF file at {path}")
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the reader raises bare ValueError/IndexError/struct errors on damaged files
        raise GGUFError(
            f"{path.name} is not a readable GGUF file ({type(e).__name__}: {_first_line(e)}); "
            "it is truncated or corrupted: download it again"
        ) from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise GGUFError(
                f"{path.name} is truncated: tensor {t.name} needs bytes up to {t.data_offset + t.n_bytes:,} "
                f"but the file has {size:,}; download it again"
            )
    return reader


def metadata(reader) -> dict:
    """The key/value metadata as plain Python values (strings, numbers, lists)."""
    out = {}
    for key, field in reader.fields.items():
        try:
            out[key] = field.contents()
        except Exception as e:
            raise GGUFError(f"metadata field {key!r} is unreadable ({_first_line(e)}); the file is corrupted") from None
    return out


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160]


# ---------------------------------------------------------------------------------------------
# the model
def config_from_gguf(meta: dict, tensor_names: set[str], name: str = "gguf") -> ModelConfig:
    """A ModelConfig from llama.cpp's `{arch}.*` metadata keys."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)}); "
            "use a Llama-family model"
        )

    def key(k: str, default=None):
        v = meta.get(f"{arch}.{k}", default)
        if v is None:
            raise GGUFError(f"GGUF metadata lacks {arch}.{k}; the file is incomplete")
        return v

    d, n_heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = d // n_heads
    rot = int(key("rope.dimension_count", head_dim))
    if rot != head_dim or int(key("attention.key_length", head_dim)) != head_dim:
        raise GGUFError(f"partial rotary or unusual head sizes (rope dims {rot}, head_dim {head_dim}) "
                        "are not supported")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", ""):
        raise GGUFError(f"RoPE scaling {scaling!r} is not supported (only plain RoPE)")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise GGUFError("GGUF metadata gives no vocabulary size (no vocab_size, no tokenizer tokens)")
    return ModelConfig(
        name=name, vocab_size=int(vocab), context=int(key("context_length")), d_model=d,
        n_layers=int(key("block_count")), n_heads=n_heads, n_kv_heads=int(key("attention.head_count_kv", n_heads)),
        d_ff=int(key("feed_forward_length")), mlp="swiglu", activation="silu", norm="rmsnorm",
        norm_eps=float(key("attention.layer_norm_rms_epsilon")), positions="rope",
        rope_theta=float(key("rope.freq_base", 10000.0)), bias=False,
        tie_embeddings="output.weight" not in tensor_names,
    )


def dequantize(t) -> np.ndarray:
    """One GGUF tensor as a float32 array in PyTorch's (out, in) order."""
    from gguf import quants

    try:
        x = quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise GGUFError(
            f"tensor {t.name} uses quantization type {t.tensor_type.name}, which the gguf package cannot "
            "dequantize; use a file quantized as F32, F16, BF16, Q4_0..Q8_0 or a K/IQ type"
        ) from None
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions innermost first
    return np.array(x, dtype=np.float32).reshape(shape)  # a copy: the file's memory map stays read-only


def unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's RoPE row order: per head, rows (0, hd/2, 1, hd/2+1, ...) back to (0, 1, ..., hd-1).

    llama.cpp pairs neighbouring features (2i, 2i+1); lumen pairs i with i + hd/2. The converter
    interleaved the two halves of each head's rows, so we split each head into (hd/2, 2) and transpose."""
    out, d_in = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, d_in).transpose(1, 2).reshape(out, d_in)


def state_from_gguf(reader, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Every tensor dequantized, renamed to lumen's parameter names, Q/K rows in lumen's RoPE order."""
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = _lumen_name(t.name)
        if name is None:  # e.g. biases, rope_freqs (Llama 3.1 RoPE scaling): a variant lumen cannot hold
            raise GGUFError(f"tensor {t.name} has no place in lumen's Llama model; this variant is not supported")
        w = torch.from_numpy(dequantize(t))
        if name.endswith("attn.q.weight"):
            w = unpermute(w, cfg.n_heads)
        elif name.endswith("attn.k.weight"):
            w = unpermute(w, cfg.kv_heads)
        state[name] = w
    return state


def _lumen_name(gguf_name: str) -> str | None:
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK:
        return f"blocks.{parts[1]}.{_BLOCK[parts[2]]}"
    return None


# ---------------------------------------------------------------------------------------------
# the tokenizer
def tokenizer_from_gguf(meta: dict) -> HFTokenizer:
    """The byte-level BPE the metadata describes: vocabulary, merges, the pre-tokenizer named by
    `tokenizer.ggml.pre`, special (control) tokens kept whole, eos id and chat template."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as _HF

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); use another file")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"pre-tokenizer {pre!r} is not supported; supported: {', '.join(PRE_TOKENIZERS)}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = _HF(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    if pre in _DIGITS_THEN_GPT2:  # every digit its own piece, then GPT-2's split
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    elif pre in _LLAMA3_SPLIT:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    out = HFTokenizer(tok, eos_token=tokens[eos] if eos is not None and eos < len(tokens) else None)
    out.chat_template = meta.get("tokenizer.chat_template")
    return out


# ---------------------------------------------------------------------------------------------
def read_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], HFTokenizer]:
    """(ModelConfig, state dict in lumen's names, tokenizer) from a GGUF file."""
    reader = open_gguf(path)
    meta = metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = config_from_gguf(meta, names, name=str(meta.get("general.name") or Path(path).stem))
    state = state_from_gguf(reader, cfg)
    return cfg, state, tokenizer_from_gguf(meta)


def load_gguf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A lumen GPT (eval mode) and its tokenizer from a GGUF file."""
    cfg, state, tok = read_gguf(path)
    model = GPT.from_state(cfg, state, source=Path(path).name)
    return model.to(device=device, dtype=dtype).eval(), tok
