"""llama.cpp's GGUF files: hyper-parameters from the metadata, tensors dequantized to float32 by the
`gguf` package (every type it can dequantize: F16, BF16, Q4_0..Q8_0, the K-quants Q2_K..Q6_K that Q4_K_M and
friends are made of, the IQ types), mapped onto lumen's model by the architecture's table (gguf_arch.py: Llama,
Qwen2, Gemma, ...); the tokenizer rebuilt as a `tokenizers` BPE.

    >>> weights = read_gguf(fetch("smollm2"))             # doctest: +SKIP
    >>> model = GPT.from_state(weights.cfg, weights.state)  # what lumen.formats.load does  # doctest: +SKIP

What in a GGUF differs from the checkpoint it was converted from:
- for "llama", llama.cpp rotates (x[2i], x[2i+1]) pairs with RoPE, Hugging Face (and lumen) rotate
  (x[i], x[i + hd/2]); so the converter permuted the rows of W_Q and W_K within each head. `unpermute` puts
  them back. (Its other architectures rotate lumen's pairs: their rows are as trained.)
- Gemma's norm weights hold 1 + g (lumen's OffsetRMSNorm holds g);
- tied embeddings: the file stores the embedding once and has no `output.weight`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from ..attention import rope_frequencies
from ..config import ModelConfig, RopeScaling
from ..errors import ConfigError, LumenError, MissingFileError, ModelFileError
from ..model import GPT
from ..tokenizers import HFTokenizer
from .gguf_arch import ARCHITECTURES, ROPE_FREQS, TOP, TOP_EXTRA, Architecture
from .weights import Weights

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

# llama.cpp's pre-tokenizer names -> how text is split before BPE (tokenizer.ggml.pre)
_GPT2_SPLIT = ("gpt2", "default", "mpt", "olmo", "jais")
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3")
# Qwen2's split: Llama 3's with every digit its own piece
_QWEN2_REGEX = _LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN2_SPLIT = ("qwen2", "deepseek-r1-qwen")
PRE_TOKENIZERS = _GPT2_SPLIT + _DIGITS_THEN_GPT2 + _LLAMA3_SPLIT + _QWEN2_SPLIT

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types for special and added tokens


class GGUFError(ModelFileError):
    """A GGUF file lumen cannot read: the message says what is wrong and what to do."""


# ---------------------------------------------------------------------------------------------
# the file
class GGUFTensor(NamedTuple):
    """One tensor of a GGUF file: its name, its type, its dimensions as the file lists them (innermost first),
    and its bytes, a read-only view of the mapped file: (..., bytes per row)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass
class GGUFFile:
    """A GGUF file as lumen reads it, in one checked pass over its header (`check_layout`'s): the metadata as
    Python values (strings, numbers, lists), the tensors, and the mapped file they are views of."""

    path: Path
    meta: dict[str, Any]
    tensors: list[GGUFTensor]
    mapped: mmap.mmap
    arch: str = ""  # general.architecture, once read_header has checked it


def open_gguf(path: str | Path) -> GGUFFile:
    """The file's metadata and tensors, after every check `check_layout` makes."""
    from gguf import GGML_QUANT_SIZES

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no GGUF file at {path}")
    h = _Header(path)
    try:
        meta, layout, start = _walk(h, path)
    except BaseException:
        _close(h)
        raise
    assert isinstance(h.data, mmap.mmap)  # (an empty file has no magic number)
    tensors = []
    for name, (kind, dims, offset, n_bytes) in layout.items():
        block, type_bytes = GGML_QUANT_SIZES[kind]
        rows = (*reversed(dims[1:]), dims[0] // block * type_bytes)  # a row's blocks are its bytes
        data = np.frombuffer(h.data, np.uint8, n_bytes, start + offset).reshape(rows)
        tensors.append(GGUFTensor(name, kind, dims, data))
    return GGUFFile(path, meta, tensors, h.data)


# GGUF value types: each scalar's little-endian struct format; 8 is a string (u64 length + bytes), 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_SCALAR_BYTES = {kind: struct.calcsize(f) for kind, f in _SCALARS.items()}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


class _Header:
    """A cursor over a GGUF file's header: every read is checked against the bytes that are left, so a
    damaged count or length is an error here, before anything loops over it or allocates for it."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0
        with open(path, "rb") as f:
            size = path.stat().st_size
            try:
                self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            except OSError as e:  # (ENOMEM: the whole file is mapped, and this process may not map that much)
                raise too_large(path, f"mapping it: {e.strerror}") from None

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path.name} is not a readable GGUF file: {what} (at byte {self.pos:,} of "
                         f"{len(self.data):,}); it is truncated or damaged: download or convert it again")

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise self.fail(f"{what} needs {n:,} bytes but only {len(self.data) - self.pos:,} are left")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, width: int, what: str) -> int:
        return int.from_bytes(self.take(width, what), "little")

    def count(self, what: str, item_bytes: int) -> int:
        """A u64 count of items that take at least item_bytes each: no more than the bytes left can hold."""
        n = self.uint(8, what)
        if n * item_bytes > len(self.data) - self.pos:
            raise self.fail(f"{what} is {n:,}, more than the rest of the file can hold")
        return n

    def string(self, what: str) -> str:
        raw = self.take(self.count(f"the length of {what}", 1), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def text(self, key: str) -> str:
        """A string of metadata `key` (its value or an item of it)."""
        raw = self.take(self.count(f"the length of a string of {key}", 1), f"a string of {key}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path.name}: metadata field {key!r} holds bytes that are not UTF-8 text (at byte "
                            f"{e.start} of a string); the file is corrupted") from None

    def value(self, kind: int, key: str) -> Any:
        """One metadata value as Python's: a number, a bool, a string or a list of one of these."""
        if kind in _SCALARS:
            return struct.unpack(_SCALARS[kind], self.take(_SCALAR_BYTES[kind], f"the value of {key}"))[0]
        if kind == _STRING:
            return self.text(key)
        if kind != _ARRAY:
            raise self.fail(f"metadata {key!r} has the unknown value type {kind}")
        item = self.uint(4, f"the item type of {key}")
        if item == _ARRAY:  # legal in the spec, but no model's metadata needs it
            raise self.fail(f"metadata {key!r} is an array of arrays, which lumen cannot read")
        if item not in _SCALARS and item != _STRING:
            raise self.fail(f"metadata {key!r} has the unknown item type {item}")
        n = self.count(f"the length of {key}", _SCALAR_BYTES.get(item, 8))
        if item == _STRING:
            return [self.text(key) for _ in range(n)]
        items = self.take(n * _SCALAR_BYTES[item], f"the items of {key}")
        return np.frombuffer(items, _SCALARS[item]).tolist()  # (one pass: Python's numbers, no array kept)


def check_layout(path: Path) -> None:
    """Walk a GGUF header (what `open_gguf` reads), making llama.cpp's checks (and one more): every count
    and length fits in the bytes left (a count is never trusted to size anything), value and tensor types are
    known, names are unique, dimensions are positive and their product stays below 2^63, each tensor's byte size
    follows from its type and shape, and each tensor's offset is exactly where the ones before it end, aligned
    (so a damaged offset, type or shape cannot make a tensor read another's bytes); the file ends with the
    last tensor's bytes (and their padding), so a last tensor whose type was changed is caught too. Nothing is
    read past the file's end and nothing is allocated for a claimed size."""
    h = _Header(path)
    try:
        _walk(h, path)
    finally:
        _close(h)


def too_large(path: Path, when: str) -> LumenError:
    """The file does not fit in the memory this process may use (a ulimit -v, a container's cap)."""
    return LumenError(f"{path.name}: the file ({path.stat().st_size / 2**30:.2f} GiB) does not fit in the memory this "
                      f"process may use ({when}): raise the memory limit (ulimit -v, a container's cap) or use a "
                      "smaller or more quantized file")


def _close(h: _Header) -> None:
    if isinstance(h.data, mmap.mmap):
        h.data.close()


def _walk(h: _Header, path: Path) -> tuple[dict[str, Any], dict[str, tuple], int]:
    """(metadata, each tensor's (type, dimensions, offset, byte size) by name, where the tensor data starts)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if h.take(4, "the magic number") != b"GGUF":
        raise h.fail("it does not start with GGUF's magic number")
    version = h.uint(4, "the version")
    if version not in (2, 3):
        raise h.fail(f"GGUF version {version} is not one lumen reads (2, 3; big-endian files are not supported)")
    n_tensors, n_kv = h.count("the tensor count", 24), h.count("the metadata count", 13)
    meta: dict[str, Any] = {}
    alignment = 32
    for _ in range(n_kv):
        key = h.string("a metadata key")
        if key in meta:
            raise h.fail(f"metadata key {key!r} appears twice")
        kind = h.uint(4, f"the type of {key}")
        meta[key] = v = h.value(kind, key)
        if key == "general.alignment":
            if kind not in (4, 10) or v == 0 or v & (v - 1):  # a u32 or u64
                raise h.fail("general.alignment is not a power of two")
            alignment = v
    tensors = {}
    for _ in range(n_tensors):
        name = h.string("a tensor name")
        n_dims = h.uint(4, f"the dimension count of {name}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise h.fail(f"tensor {name} claims {n_dims} dimensions")
        dims = [h.uint(8, f"a dimension of {name}") for _ in range(n_dims)]
        kind, offset = h.uint(4, f"the type of {name}"), h.uint(8, f"the offset of {name}")
        if name in tensors:
            raise h.fail(f"tensor {name} appears twice")
        try:
            block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise h.fail(f"tensor {name} has the unknown type id {kind}") from None
        if not _can_dequantize(GGMLQuantizationType(kind)):
            raise GGUFError(f"{path.name}: {_unsupported(name, GGMLQuantizationType(kind))}")
        if min(dims) < 1 or dims[0] % block or offset % alignment:
            raise h.fail(f"tensor {name} has dimensions {dims} or offset {offset:,} that do not fit its type")
        if math.prod(dims) >= 2**63:  # ggml counts elements in an int64
            raise h.fail(f"tensor {name}'s dimensions {dims} multiply to 2^63 elements or more")
        tensors[name] = (GGMLQuantizationType(kind), tuple(dims), offset, math.prod(dims) // block * type_bytes)
    start = -(-h.pos // alignment) * alignment  # the data section, after the header's padding
    size = 0  # where the next tensor must start: the ones before it, each padded to the alignment
    for name, (_, _, offset, n_bytes) in tensors.items():
        if offset != size:
            raise GGUFError(f"{path.name} is not a readable GGUF file: tensor {name}'s data is at offset {offset:,}, "
                            f"but the tensors before it end at {size:,} (its offset, or the type or shape of a tensor "
                            "before it, was changed); download or convert it again")
        if start + offset + n_bytes > len(h.data):
            raise GGUFError(f"{path.name} is truncated: tensor {name} needs bytes up to {start + offset + n_bytes:,} "
                            f"but the file has {len(h.data):,}; download it again")
        size = offset + -(-n_bytes // alignment) * alignment
    if tensors and len(h.data) > start + size:
        raise GGUFError(f"{path.name} has {len(h.data) - start - size:,} bytes after its last tensor's: the type or "
                        "shape of a tensor was changed, or data was appended; download or convert it again")
    return meta, tensors, start


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160]


# ---------------------------------------------------------------------------------------------
# the model
def architecture(meta: dict) -> tuple[str, Architecture]:
    """The file's `general.architecture` and its table; one lumen cannot hold is refused by name."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise GGUFError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)}); "
            "load the Hugging Face model (directory or hf:ORG/NAME) instead, or a file of a supported architecture"
        )
    return arch, ARCHITECTURES[arch]


def config_from_gguf(meta: dict, tensor_names: set[str], name: str = "gguf",
                     shapes: dict[str, tuple[int, ...]] | None = None) -> ModelConfig:
    """A ModelConfig from llama.cpp's `{arch}.*` metadata keys (each checked for its type: a damaged value is a
    GGUFError naming the key) and the architecture's fixed choices (gguf_arch.ARCHITECTURES)."""
    arch, table = architecture(meta)

    def key(k: str, default=None, kind: type = int):
        v = meta.get(f"{arch}.{k}", default)
        if v is None:
            raise GGUFError(f"GGUF metadata lacks {arch}.{k}; the file is incomplete")
        if isinstance(v, bool) or not isinstance(v, int if kind is int else (int, float)):
            raise GGUFError(f"GGUF metadata {arch}.{k} must be a {'whole ' if kind is int else ''}number, got {v!r}")
        return v

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "", "linear"):
        raise GGUFError(f"RoPE scaling {scaling!r} ({arch}.rope.scaling.type) is not supported (plain RoPE, "
                        "linear scaling and Llama 3's rope_freqs are); use a file without it")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size") or (len(tokens) if isinstance(tokens, list) else 0)
    if not vocab:
        raise GGUFError("GGUF metadata gives no vocabulary size (no vocab_size, no tokenizer tokens)")
    n_heads, d_model = key("attention.head_count"), key("embedding_length")
    d_head = key("attention.key_length", 0)
    if key("attention.value_length", d_head) != d_head:
        raise GGUFError(f"{arch}.attention.value_length differs from key_length ({d_head}); lumen's heads have "
                        "one width")
    d_ff = key("feed_forward_length")
    up = (shapes or {}).get(f"blk.0.{table.d_ff_tensor}") if table.d_ff_tensor else None
    if up is not None and len(up) == 2:  # (the converter writes 4 d_model as Phi-2's feed_forward_length)
        d_ff = up[1]
    try:
        extra: dict[str, Any] = {}
        for f, k in table.meta_fields.items():  # e.g. Gemma 2's soft-caps, a window; 0 means none (Phi-3)
            if f"{arch}.{k}" in meta:
                extra[f] = key(k, kind=float if f.endswith("softcap") else int) or None
        if scaling == "linear":
            extra["rope_scaling"] = RopeScaling("linear", key("rope.scaling.factor", kind=float))
        n_layers = key("block_count")
        if (arch, n_layers) in (("gemma2", 46), ("gemma3", 62)):  # llama.cpp's rule for Gemma 2 and 3 27B:
            extra["query_pre_attn_scalar"] = d_model / n_heads  # queries scaled by 1/sqrt(d / n_heads)
        cfg = ModelConfig(**dict(
            name=name, vocab_size=vocab, context=key("context_length"), d_model=d_model,
            n_layers=n_layers, n_heads=n_heads, n_kv_heads=key("attention.head_count_kv", n_heads),
            d_ff=d_ff, norm_eps=key(table.norm_eps_key, kind=float),
            rope_theta=key("rope.freq_base", 10000.0, kind=float),
            d_head=d_head if d_head and d_head * n_heads != d_model else None,
            tie_embeddings="output.weight" not in tensor_names,
        ) | table.fields | extra)  # (the metadata's own fields last: Qwen3-MoE's expert width is its d_ff)
        rot = key("rope.dimension_count", cfg.head_dim)
        if rot != cfg.head_dim:
            if table.permuted_qk:  # (the converter's permutation is over whole heads)
                raise GGUFError(f"{arch}.rope.dimension_count is {rot}, not the head width {cfg.head_dim}; "
                                "partial rotary is not supported for this architecture")
            cfg = cfg.replace(rotary_fraction=rot / cfg.head_dim)
    except ConfigError as e:
        raise GGUFError(f"the metadata describes no valid model: {e}") from None
    return cfg


def rope_from_freqs(file: GGUFFile, cfg: ModelConfig) -> ModelConfig:
    """Llama 3.1+'s `rope_freqs.weight` (each RoPE frequency's divisor) as the config's "llama3" RopeScaling.

    The file keeps the divisors, not the four numbers they came from: the largest divisor is `factor`, and the
    divisors strictly between 1 and factor follow a blend linear in 1 / wavelength, whose slope and intercept
    give high_freq_factor and the original context once low_freq_factor is taken as Llama 3's 1. With fewer than
    two blended divisors the numbers are not determined, and any that reproduce the divisors will do: Llama
    3's (high 4), then others are tried. Each candidate's frequencies are compared with the file's; a file none
    reproduces is refused, naming the tensor."""
    t = next((t for t in file.tensors if t.name == ROPE_FREQS), None)
    if t is None:
        return cfg
    divisors = dequantize(t).reshape(-1).astype(np.float64)
    pairs = cfg.rotary_dims // 2
    if divisors.shape[0] != pairs or not np.all(np.isfinite(divisors)) or divisors.min() <= 0:
        raise GGUFError(f"tensor {ROPE_FREQS} has {divisors.shape[0]} divisors (want {pairs}, finite, positive); "
                        "the file is damaged")
    if np.allclose(divisors, 1.0, rtol=0, atol=1e-6):
        return cfg
    inv_freq = cfg.rope_theta ** (-np.arange(0, cfg.rotary_dims, 2) / cfg.rotary_dims)
    wavelength = 2 * math.pi / inv_freq
    factor = float(divisors.max())
    blended = (divisors > 1 + 1e-4) & (divisors < factor * (1 - 1e-4))
    s = (1 / divisors - 1 / factor) / (1 - 1 / factor)  # the blend: (original / wavelength - low) / (high - low)
    low, candidates = 1.0, []
    if blended.sum() >= 2:
        slope, at_zero = np.polyfit(1 / wavelength[blended], s[blended], 1)
        high = low - low / at_zero if at_zero < 0 else 4.0
        candidates.append((high, slope * (high - low)))
    for high in (4.0, 2.0, 8.0, 16.0):
        if blended.sum() == 1:
            candidates.append((high, float(wavelength[blended][0] * (s[blended][0] * (high - low) + low))))
        elif not blended.any():  # a context between the fast wavelengths and the slow ones
            slow = wavelength[divisors >= factor * (1 - 1e-4)]
            candidates.append((high, float(slow.min()) * low))
    scaling = None
    for high, original in candidates:
        try:
            trial = RopeScaling("llama3", factor, low, high, max(1, int(round(original))))
        except ConfigError:
            continue
        ours = rope_frequencies(cfg.rotary_dims, cfg.rope_theta, trial).double().numpy()
        if np.allclose(ours, inv_freq / divisors, rtol=1e-5, atol=0):
            scaling = trial
            break
    if scaling is None:
        raise GGUFError(f"tensor {ROPE_FREQS} rescales RoPE's frequencies in a way Llama 3's scaling does not "
                        f"reproduce (divisors {divisors.min():.3g}..{divisors.max():.3g}); lumen cannot hold it")
    return cfg.replace(rope_scaling=scaling)


def dequantize(t) -> np.ndarray:
    """One GGUF tensor as a float32 array in PyTorch's (out, in) order."""
    from gguf import quants

    try:
        with np.errstate(invalid="ignore", over="ignore"):  # (NaN/inf weights are refused by GPT.from_state)
            x = quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise _unsupported(t.name, t.tensor_type) from None
    except ValueError as e:  # quants' own check: a byte count that is not whole blocks of the type
        raise GGUFError(
            f"tensor {t.name}'s bytes do not fit its type {t.tensor_type.name} ({_first_line(e)})"
        ) from None
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions innermost first
    return np.array(x, dtype=np.float32).reshape(shape)  # a copy: the file's memory map stays read-only


def _unsupported(name: str, kind) -> GGUFError:
    return GGUFError(
        f"tensor {name} uses quantization type {kind.name}, which the gguf package cannot "
        "dequantize; use a file quantized as F32, F16, BF16, Q4_0..Q8_0 or a K/IQ type"
    )


@functools.cache
def _can_dequantize(kind) -> bool:
    """Whether the gguf package dequantizes this type (tried on one block of zeros)."""
    from gguf import GGML_QUANT_SIZES, quants

    try:
        quants.dequantize(np.zeros(GGML_QUANT_SIZES[kind][1], np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's RoPE row order: per head, rows (0, hd/2, 1, hd/2+1, ...) back to (0, 1, ..., hd-1).

    llama.cpp pairs neighbouring features (2i, 2i+1); lumen pairs i with i + hd/2. The converter
    interleaved the two halves of each head's rows, so we split each head into (hd/2, 2) and transpose."""
    out, d_in = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, d_in).transpose(1, 2).reshape(out, d_in)


def _permuted_heads(name: str, cfg: ModelConfig, table: Architecture) -> int | None:
    """How many heads llama.cpp's converter interleaved this tensor's rows by (W_Q, W_K of "llama"), else None."""
    if not table.permuted_qk:
        return None
    if name.endswith("attn.q.weight"):
        return cfg.n_heads
    if name.endswith("attn.k.weight"):
        return cfg.kv_heads
    return None


def check_tensors(file: GGUFFile, cfg: ModelConfig, table: Architecture) -> dict[str, tuple[str, ...]]:
    """The tensors are the ones `cfg` needs: known names, one set per block, shapes as the config says,
    float or quantized types (not integers). Returns each tensor's lumen parameters (several for a fused one,
    in row order), config-only tensors (rope_freqs) left out."""
    from gguf import GGMLQuantizationType as T

    placed: dict[str, tuple[str, ...]] = {}
    for t in file.tensors:
        if t.name in table.optional:  # read into the config (rope_freqs), not a parameter
            continue
        parts = _lumen_names(t.name, table, cfg.n_experts or 0)
        if parts is None:  # e.g. biases where the architecture has none: a variant lumen cannot hold
            raise GGUFError(f"tensor {t.name} has no place in lumen's {file.arch!r} model; this variant is not "
                            "supported")
        placed[t.name] = parts
    names = {n for parts in placed.values() for n in parts}
    blocks = {n.split(".")[1] for n in names if n.startswith("blocks.")}
    if blocks != {str(i) for i in range(cfg.n_layers)}:
        raise GGUFError(f"the metadata says {cfg.n_layers} blocks but the tensors belong to blocks "
                        f"{sorted(blocks, key=int)[:8]}; the file is damaged or mislabelled")
    want = GPT.template(cfg).state_dict()
    missing = sorted(set(want) - names - ({"lm_head.weight"} if cfg.tie_embeddings else set()))
    if missing:
        raise GGUFError(f"the file has no tensor for {missing[0]} ({len(missing)} missing); it is incomplete or "
                        "not what its architecture says")
    unknown = sorted(names - set(want))
    if unknown:
        raise GGUFError(f"the file holds {unknown[0]}, which the metadata's model has no place for; the file is "
                        "damaged or mislabelled")
    for t in file.tensors:
        if t.name not in placed:
            continue
        parts = placed[t.name]
        shape = tuple(int(n) for n in reversed(t.shape))
        if len(parts) > 1:  # fused or stacked: compared as one matrix of all the parts' rows
            shape = (math.prod(shape[:-1]), shape[-1])
        need = (sum(int(want[p].shape[0]) for p in parts), *want[parts[0]].shape[1:])
        if shape != need:
            raise GGUFError(f"tensor {t.name} has shape {shape} but the metadata needs {need}")
        if t.tensor_type in (T.I8, T.I16, T.I32, T.I64):
            raise GGUFError(f"tensor {t.name} holds integers ({t.tensor_type.name}); weights must be floating point")
    return placed


def _lumen_names(gguf_name: str, table: Architecture, n_experts: int = 0) -> tuple[str, ...] | None:
    """The lumen parameter(s) a GGUF tensor holds: one, or the parts of a fused tensor in row order (a
    mixture's stacked tensor: each expert's)."""
    if gguf_name in TOP or gguf_name in TOP_EXTRA:
        return ((TOP | TOP_EXTRA)[gguf_name],)
    parts = gguf_name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk":
        return None
    if parts[2] in table.experts and n_experts:
        return tuple(f"blocks.{parts[1]}.mlp.experts.{e}.{table.experts[parts[2]]}" for e in range(n_experts))
    if parts[2] in table.fused:
        return tuple(f"blocks.{parts[1]}.{n}" for n in table.fused[parts[2]])
    if parts[2] in table.block:
        return (f"blocks.{parts[1]}.{table.block[parts[2]]}",)
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
    tokens = _list_of(meta, "tokenizer.ggml.tokens", str, required=True)
    if "tokenizer.ggml.merges" not in meta:  # (llama.cpp refuses the file too: without them every word is bytes)
        raise GGUFError("the byte-level BPE tokenizer has no tokenizer.ggml.merges, so it cannot split text as the "
                        "model was trained; the file is incomplete: convert the model again")
    merges = _list_of(meta, "tokenizer.ggml.merges", str)
    if any(m.count(" ") != 1 for m in merges):
        raise GGUFError("tokenizer.ggml.merges holds an entry that is not two tokens joined by one space; "
                        "the tokenizer metadata is damaged")
    try:
        tok = _HF(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges],
                             fuse_unk=False))
    except Exception as e:  # tokenizers raises a bare Exception, e.g. for a merge of unknown tokens
        raise GGUFError(f"the tokenizer metadata is damaged ({_first_line(e)})") from None
    if pre in _DIGITS_THEN_GPT2:  # every digit its own piece, then GPT-2's split
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    elif pre in _LLAMA3_SPLIT:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    elif pre in _QWEN2_SPLIT:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_QWEN2_REGEX), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    types = _list_of(meta, "tokenizer.ggml.token_type", int)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < len(tokens)):
        raise GGUFError(f"tokenizer.ggml.eos_token_id {eos!r} is not a token id (0..{len(tokens) - 1})")
    template = meta.get("tokenizer.chat_template")
    if not isinstance(template, (str, type(None))):
        raise GGUFError(f"tokenizer.chat_template must be a string, got {template!r}")
    out = HFTokenizer(tok, eos_token=tokens[eos] if eos is not None else None)
    out.chat_template = template
    return out


def _list_of(meta: dict, key: str, kind: type, required: bool = False) -> list:
    """A metadata array whose items are all of one type (bool is not an int here)."""
    v = meta.get(key)
    if v is None and not required:
        return []
    if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, kind) for x in v):
        raise GGUFError(f"GGUF metadata {key} must be a non-empty array of {kind.__name__}s; the file is damaged")
    return v


# ---------------------------------------------------------------------------------------------
def read_gguf(path: str | Path, quantized: bool = False) -> Weights:
    """The config, tensors in lumen's names and tokenizer of a GGUF file; whatever is wrong with the file is a
    GGUFError naming it. quantized=True keeps the Q8_0/Q4_1 matrices as the file's blocks (`stored_quantized`, in
    Weights.quantized: lumen.fast decodes from them) and dequantizes only the rest (the norms)."""
    try:
        return _read_gguf(path, quantized)
    except MemoryError:  # (numpy's copies of the tensors; the mapping itself is refused in _Header)
        raise too_large(Path(path), "reading its tensors") from None


def _read_gguf(path: str | Path, quantized: bool) -> Weights:
    with naming(path):
        file, cfg, tok = read_header(path)
        table = ARCHITECTURES[file.arch]
        placed = check_tensors(file, cfg, table)  # names, block count, shapes, types: before any dequantizing
        want = GPT.template(cfg).state_dict()
        out = Weights(cfg, {}, Path(path).name, tok)
        for t in file.tensors:
            if t.name not in placed:
                continue
            parts = placed[t.name]
            if len(parts) > 1:  # fused (Phi-3's attn_qkv, gate+up) or stacked (experts): split by rows
                rows = [int(want[p].shape[0]) for p in parts]
                whole = torch.from_numpy(dequantize(t))
                out.state |= dict(zip(parts, whole.reshape(-1, whole.shape[-1]).split(rows)))
                release(file)
                continue
            name = parts[0]
            heads = _permuted_heads(name, cfg, table)
            kept = stored_quantized(t) if quantized and name.endswith(".weight") else None
            if kept is None:
                w = torch.from_numpy(dequantize(t))
                if table.norm_plus_one and t.name.endswith("norm.weight"):
                    w = w - 1  # the converter stored Gemma's gain 1 + g; lumen's OffsetRMSNorm holds g
                out.state[name] = unpermute(w, heads) if heads else w
                release(file)
                continue
            codes, scale, minimum = kept
            if not torch.isfinite(scale).all() or (minimum is not None and not torch.isfinite(minimum).all()):
                raise GGUFError(f"{Path(path).name}: tensor {t.name} holds NaN or infinite block scales or minima; "
                                "the file is damaged")
            if heads:  # whole rows move: each row's blocks stay intact
                codes, scale = unpermute(codes, heads), unpermute(scale, heads)
                minimum = unpermute(minimum, heads) if minimum is not None else None
            out.quantized[name] = (codes, scale, minimum)
            release(file)
    return out


def release(file: GGUFFile) -> None:
    """Drop the file's pages from this process's memory: every tensor read so far is a copy, and the pages of
    a read-only mapping come back from the file if touched again. Otherwise the whole file is resident at
    the end of the read, on top of the copies (~94 MiB more peak memory for SmolLM2's GGUF)."""
    if hasattr(mmap, "MADV_DONTNEED"):
        file.mapped.madvise(mmap.MADV_DONTNEED)


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Whatever is wrong with the file is a GGUFError that names it."""
    try:
        yield
    except ModelFileError as e:
        if Path(path).name in str(e):
            raise
        raise GGUFError(f"{Path(path).name}: {e}") from None


def read_header(path: str | Path) -> tuple[GGUFFile, ModelConfig, HFTokenizer]:
    """(the file, its ModelConfig, its tokenizer) from a GGUF file's metadata. The metadata is dropped once
    read: for a large vocabulary it is ~100k strings, and the tensors do not need them."""
    file = open_gguf(path)
    meta = file.meta
    names = {t.name for t in file.tensors}
    title = meta.get("general.name")
    cfg = config_from_gguf(meta, names, name=title if isinstance(title, str) and title else Path(path).stem,
                           shapes={t.name: t.shape for t in file.tensors})
    file.arch = meta["general.architecture"]
    cfg = rope_from_freqs(file, cfg)
    tok = tokenizer_from_gguf(meta)
    tok.check_fits(cfg.vocab_size, "the tokenizer metadata")
    file.meta = {}
    return file, cfg, tok


def stored_quantized(tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """A Q8_0 or Q4_1 tensor's blocks as the file stores them (None for any other type): (codes, scale,
    minimum). A block is 32 numbers of one row. Q8_0: w = d q, codes (out, in) int8, one scale d per block.
    Q4_1: w = d q + m, codes (out, in / 2) uint8, two to a byte (a block's numbers 0-15 in the low halves of
    its 16 bytes, 16-31 in the high halves), and per block a scale d and a minimum m. Scales and minima
    (out, in / 32) are the file's float16."""
    from gguf import GGMLQuantizationType as Q

    block = 32
    raw = np.asarray(tensor.data, dtype=np.uint8)  # (out, bytes per row)
    out = raw.shape[0]
    if tensor.tensor_type == Q.Q8_0:
        b = raw.reshape(out, -1, 2 + block)
        scale = b[..., :2].copy().view(np.float16)[..., 0]
        codes = b[..., 2:].copy().view(np.int8).reshape(out, -1)
        return torch.from_numpy(codes), torch.from_numpy(scale), None
    if tensor.tensor_type == Q.Q4_1:
        b = raw.reshape(out, -1, 4 + block // 2)
        scale = b[..., 0:2].copy().view(np.float16)[..., 0]
        minimum = b[..., 2:4].copy().view(np.float16)[..., 0]
        codes = b[..., 4:].reshape(out, -1)  # packed, as stored
        return torch.from_numpy(codes.copy()), torch.from_numpy(scale), torch.from_numpy(minimum)
    return None
