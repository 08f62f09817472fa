"""Fuzzing the model-file loaders: small valid files that lumen writes itself (a GGUF file, a checkpoint and
a run directory, a Hugging Face directory, tokenizer.json, config.json, a tuned lens), damaged in every way
a disk, a download or a hand edit damages them, and loaded through lumen's public loaders.

The property, for every case: loading raises a LumenError whose one-line message names the file (or its
directory), or it returns something that works: a model whose forward pass gives finite logits (and the
reference logits where the damage must not change the weights), a tokenizer whose ids fit the model.
Cases that are wrong by construction (NaN eps, shapes that disagree with the config, a value of the wrong
type) must be refused. Any other exception type fails the case, and so does a case that runs past
CASE_SECONDS (a hang, or memory allocated for an absurd size).

The cases are a seeded loop (reproducible, no shrinking needed: each case says what it changed), built when
a family's test runs (one test per family lists all of its failures): ~940 by default; `LUMEN_FUZZ_EXAMPLES=N`
draws N random mutations per family on top of the enumerated ones, for the nightly kind of run:
`LUMEN_FUZZ_EXAMPLES=2000 pytest -m fuzz tests/test_fuzz_files.py`; `LUMEN_FUZZ_TALLY=out.jsonl` records every
outcome instead of failing.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import random
import shutil
import signal
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter, quants
from gguf import GGUFValueType as V

from helpers.gguf import GGUF_NAMES, MERGES, SPECIALS, TOKENS, gguf_tensors
from lumen.config import ModelConfig
from lumen.errors import LumenError
from lumen.formats import load
from lumen.formats.checkpoint import save_checkpoint
from lumen.formats.gguf import tokenizer_from_gguf
from lumen.formats.hf import save_hf_dir
from lumen.inspect.tuned_lens import TunedLens
from lumen.model import GPT
from lumen.tokenizers import CharTokenizer

pytestmark = pytest.mark.fuzz
logging.getLogger("gguf").setLevel(logging.ERROR)

EXTRA = int(os.environ.get("LUMEN_FUZZ_EXAMPLES", "0"))  # random mutations per family beyond the default
TALLY = os.environ.get("LUMEN_FUZZ_TALLY")  # a file: record every outcome there instead of failing
CASE_SECONDS = 20
IDS = torch.tensor([[1, 5, 9, 2, 7, 3]])



def tiny_llama(seed: int = 0, tie: bool = True) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig.from_name("baby-llama").replace(
        vocab_size=len(TOKENS), context=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
        tie_embeddings=tie, name="tiny-llama",
    )
    return GPT(cfg).eval()


def tiny_gpt2(seed: int = 0) -> tuple[GPT, CharTokenizer]:
    torch.manual_seed(seed)
    tok = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,\n")
    cfg = ModelConfig.from_name("baby-gpt").replace(
        vocab_size=tok.vocab_size, context=16, d_model=16, n_layers=2, n_heads=2, name="tiny-gpt2")
    return GPT(cfg).eval(), tok


# ---------------------------------------------------------------------------------------------
# writing a GGUF file, with any metadata or tensor replaced
def gguf_meta(cfg: ModelConfig) -> dict[str, tuple]:
    a = "llama."
    return {
        "general.name": ("tiny", V.STRING), a + "block_count": (cfg.n_layers, V.UINT32),
        a + "context_length": (cfg.context, V.UINT32), a + "embedding_length": (cfg.d_model, V.UINT32),
        a + "feed_forward_length": (cfg.hidden, V.UINT32), a + "attention.head_count": (cfg.n_heads, V.UINT32),
        a + "attention.head_count_kv": (cfg.kv_heads, V.UINT32), a + "rope.freq_base": (cfg.rope_theta, V.FLOAT32),
        a + "attention.layer_norm_rms_epsilon": (cfg.norm_eps, V.FLOAT32),
        a + "rope.dimension_count": (cfg.head_dim, V.UINT32), a + "vocab_size": (cfg.vocab_size, V.UINT32),
        "tokenizer.ggml.model": ("gpt2", V.STRING), "tokenizer.ggml.pre": ("smollm", V.STRING),
        "tokenizer.ggml.tokens": (TOKENS, V.ARRAY), "tokenizer.ggml.merges": (MERGES, V.ARRAY),
        "tokenizer.ggml.token_type": ([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)), V.ARRAY),
        "tokenizer.ggml.bos_token_id": (1, V.UINT32), "tokenizer.ggml.eos_token_id": (2, V.UINT32),
        "tokenizer.chat_template": ("{% for m in messages %}{{ m['content'] }}{% endfor %}", V.STRING),
    }


def write_gguf(path: Path, model: GPT, meta: dict | None = None, tensors: dict | None = None,
               types: dict[str, Q] | None = None, arch: str = "llama") -> Path:
    """model as a GGUF file; `meta` and `tensors` replace entries (a value of None drops one);
    `types` quantizes tensors; a tensor given as (raw uint8 bytes, shape, type) is written as it is."""
    kv = gguf_meta(model.cfg) | (meta or {})
    ts = gguf_tensors(model) | (tensors or {})
    w = GGUFWriter(str(path), arch)
    for key, entry in kv.items():
        if entry is not None:
            w.add_key_value(key, *entry)
    for name, t in ts.items():
        if t is None:
            continue
        if isinstance(t, tuple):  # raw bytes with a claimed shape and type
            raw, shape, kind = t
            w.add_tensor(name, raw, raw_shape=shape, raw_dtype=kind)
        elif (types or {}).get(name, Q.F32) != Q.F32:
            w.add_tensor(name, quants.quantize(np.ascontiguousarray(t), types[name]), raw_dtype=types[name])
        else:
            w.add_tensor(name, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------
# the cases
@dataclass
class Case:
    family: str                      # which loader
    what: str                        # what was changed (the test id)
    make: Callable[[Path], Path]     # writes the input into an empty folder, returns the spec path
    wrong: bool = False              # wrong by construction: must be refused
    same_weights: bool = False       # damage that must not change the model: logits equal the original's

    def __repr__(self) -> str:
        return f"{self.family}:{self.what}"


class Templates:
    """The valid inputs every mutation starts from, built once (bytes and JSON, ready to copy)."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.llama = tiny_llama()
        self.llama_untied = tiny_llama(seed=1, tie=False)
        self.gpt2, self.chars = tiny_gpt2()
        self.gguf = write_gguf(root / "base.gguf", self.llama).read_bytes()
        qtypes = {"blk.0.attn_q.weight": Q.Q8_0, "blk.0.ffn_down.weight": Q.Q4_1, "blk.1.ffn_up.weight": Q.Q8_0}
        self.gguf_q = write_gguf(root / "q.gguf", self.llama, types=qtypes).read_bytes()
        self.gguf_layout = gguf_layout(root / "base.gguf")
        self.gguf_data_start = GGUFReader(root / "base.gguf").data_offset
        meta = {k: v.contents() for k, v in GGUFReader(root / "base.gguf").fields.items()}
        self.bpe = tokenizer_from_gguf(meta)
        ck = save_checkpoint(root / "ckpt", self.gpt2, self.chars, meta={"step": 1})
        self.ckpt = {p.name: p.read_bytes() for p in ck.iterdir()}
        hf = save_hf_dir(self.llama_untied, root / "hf")
        self.bpe.save(hf)
        self.hf = {p.name: p.read_bytes() for p in hf.iterdir()}
        lens = TunedLens(self.gpt2)
        with torch.no_grad():
            for t in lens.translators:
                t.lin.weight.normal_(0, 0.01)
        self.lens = lens.save(root / "lens.safetensors").read_bytes()
        load(root / "base.gguf")  # (the first load imports much: not in a case's time)
        with torch.no_grad():
            self.logits = {"llama": self.llama(IDS)[0], "llama_untied": self.llama_untied(IDS)[0],
                           "gpt2": self.gpt2(IDS)[0]}


def gguf_layout(path: Path) -> list[tuple[str, int, int]]:
    """(what, byte offset, width) of every count, length, type id, dimension and offset in a GGUF header."""
    r = GGUFReader(path)
    base = r.data.ctypes.data
    out = []
    for name, f in r.fields.items():
        for i, part in enumerate(f.parts[:6]):  # key length, value type, array item type and length, first item
            if part.dtype.itemsize in (4, 8) and part.size == 1 and part.dtype.kind in "ui":
                out.append((f"{name}[{i}]", part.ctypes.data - base, part.dtype.itemsize))
    for t in r.tensors:
        _len, _name, n_dims, dims, kind, offset = t.field.parts
        for what, part in (("name_len", _len), ("n_dims", n_dims), ("type", kind), ("offset", offset)):
            out.append((f"{t.name}.{what}", part.ctypes.data - base, part.dtype.itemsize))
        for j in range(dims.size):
            out.append((f"{t.name}.dim{j}", dims[j:j + 1].ctypes.data - base, 8))
    return out


HOSTILE_U32 = [0, 1, 2, 7, 9, 13, 31, 2**31 - 1, 2**32 - 1]
HOSTILE_U64 = [0, 1, 3, 2**31, 2**32 - 1, 2**40, 2**63 - 1, 2**64 - 1]
HOSTILE_JSON = ["7", 3.5, -1, 0, None, True, False, math.nan, math.inf, -math.inf, 1e308, 2**63, 2**40, [], {},
                "", "rope", 10**30]


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def damaged(data: bytes, rng: random.Random, region: tuple[int, int] | None = None) -> tuple[bytes, str]:
    """One random damage to bytes: a truncation, a few flipped bits, or a run of garbage."""
    lo, hi = region or (0, len(data))
    kind = rng.choice(["truncate", "flip", "flip", "garbage"])
    if kind == "truncate":
        at = rng.randrange(lo, hi)
        return data[:at], f"truncated at {at}"
    b = bytearray(data)
    if kind == "flip":
        spots = [(rng.randrange(lo, hi), rng.randrange(8)) for _ in range(rng.choice([1, 1, 2, 8]))]
        for at, bit in spots:
            b[at] ^= 1 << bit
        return bytes(b), f"bits flipped at {spots[:2]}"
    at = rng.randrange(lo, hi)
    n = rng.choice([1, 4, 8, 64])
    b[at:at + n] = rng.randbytes(n)
    return bytes(b[:len(data)]), f"{n} garbage bytes at {at}"


def json_bytes(obj) -> bytes:
    return json.dumps(obj, indent=1).encode()


# --- GGUF ---------------------------------------------------------------------------------------
def gguf_cases(T: Templates, n_random: int) -> list[Case]:
    cases = []
    data, size = T.gguf, len(T.gguf)

    def from_bytes(what: str, b: bytes, wrong: bool = False) -> Case:
        return Case("gguf", what, lambda d: write(d / "m.gguf", b), wrong=wrong)

    def rewritten(what: str, wrong: bool = True, model: GPT | None = None, **kw) -> Case:
        return Case("gguf", what, lambda d: write_gguf(d / "m.gguf", model or T.llama, **kw), wrong=wrong)

    # truncation at every region: header, each metadata field and tensor record, the data
    cuts = {0, 3, 4, 8, 16, 23, 24, T.gguf_data_start - 1, T.gguf_data_start, size - 1}
    cuts |= {at + d for _, at, _ in T.gguf_layout[::10] for d in (0, 1)}
    for at in sorted(cuts):
        cases.append(from_bytes(f"truncated-at-{at}", data[:at]))
    # every count, length and type id of the header and the metadata, and the dimensions, type ids and
    # offsets of some tensor records, set to hostile values
    for what, at, width in T.gguf_layout:
        values = HOSTILE_U32 if width == 4 else HOSTILE_U64
        n = len(values) if what.startswith("GGUF.") else 1 if what.split(".")[0] != "blk" or "1.ffn" in what else 0
        for v in random.Random(what).sample(values, n):
            b = bytearray(data)
            b[at:at + width] = v.to_bytes(width, "little")
            cases.append(from_bytes(f"{what}={v}", bytes(b)))
    # the same for the quantized file's tensor records (type ids and offsets: bytes of another block size)
    for what, at, width in gguf_layout_q(T):
        for v in {"type": [1, 2, 8, 9, 14, 30], "offset": [32, 2**64 - 32], "dim0": [16, 31, 33]}[what.split(".")[-1]]:
            b = bytearray(T.gguf_q)
            b[at:at + width] = v.to_bytes(width, "little")
            cases.append(Case("gguf", f"q:{what}={v}", lambda d, b=bytes(b): write(d / "m.gguf", b)))

    # values the metadata must not hold
    a = "llama."
    huge = 2**32 - 1
    for key, values in {
        "block_count": [huge, 2**31, 1000, 3, 1, 0],
        "attention.head_count": [3, 5, 0, 64, huge],
        "attention.head_count_kv": [3, 0, 8, huge],
        "embedding_length": [0, 16, 48, huge],
        "feed_forward_length": [0, 32, huge],
        "context_length": [0, huge],
        "rope.dimension_count": [0, 4, huge],
        "vocab_size": [10, huge],
    }.items():
        for v in values:
            cases.append(rewritten(f"{key}={v}", meta={a + key: (v, V.UINT32)}))
    for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base"):
        for v in (math.nan, math.inf, -math.inf, 0.0, -1.0):
            cases.append(rewritten(f"{key}={v}", meta={a + key: (v, V.FLOAT32)}))
        cases.append(rewritten(f"{key}=string", meta={a + key: ("1e-5", V.STRING)}))
        cases.append(rewritten(f"{key}=bool", meta={a + key: (True, V.BOOL)}))
        cases.append(rewritten(f"{key}=array", meta={a + key: ([1.0, 2.0], V.ARRAY)}))
    for key in ("block_count", "embedding_length", "attention.head_count", "context_length"):
        cases.append(rewritten(f"{key}=string", meta={a + key: ("2", V.STRING)}))
        cases.append(rewritten(f"{key}=float", meta={a + key: (2.5, V.FLOAT32)}))
        cases.append(rewritten(f"{key}=negative", meta={a + key: (-2, V.INT32)}))
        cases.append(rewritten(f"{key}=bool", meta={a + key: (True, V.BOOL)}))
        cases.append(rewritten(f"{key}=missing", meta={a + key: None}))
    cases.append(rewritten("block_count=int64-huge", meta={a + "block_count": (2**62, V.UINT64)}))
    cases.append(rewritten("arch=bert", arch="bert"))
    cases.append(rewritten("nested-array-of-arrays", wrong=False,
                           meta={"general.tags": ([[1, 2], [3, 4, 5]], V.ARRAY)}))
    cases.append(rewritten("tokens=ints", meta={"tokenizer.ggml.tokens": (list(range(len(TOKENS))), V.ARRAY)}))
    cases.append(rewritten("tokens=string", meta={"tokenizer.ggml.tokens": ("abc", V.STRING)}))
    cases.append(rewritten("tokens=missing", meta={"tokenizer.ggml.tokens": None}))
    cases.append(rewritten("tokens=duplicates", meta={"tokenizer.ggml.tokens": (["a"] * len(TOKENS), V.ARRAY)}))
    cases.append(rewritten("tokens=too-many", meta={"tokenizer.ggml.tokens": (TOKENS + ["x1", "x2"], V.ARRAY)}))
    cases.append(rewritten("merges=one-word", meta={"tokenizer.ggml.merges": (["Ġt", "he"], V.ARRAY)}))
    cases.append(rewritten("merges=unknown-token", meta={"tokenizer.ggml.merges": (["qq zz"], V.ARRAY)}))
    cases.append(rewritten("merges=ints", meta={"tokenizer.ggml.merges": ([1, 2, 3], V.ARRAY)}))
    cases.append(rewritten("merges=string", meta={"tokenizer.ggml.merges": ("h e", V.STRING)}))
    cases.append(rewritten("token_type=strings", meta={"tokenizer.ggml.token_type": (["3"] * len(TOKENS), V.ARRAY)}))
    cases.append(rewritten("token_type=short", wrong=False, meta={"tokenizer.ggml.token_type": ([3, 3], V.ARRAY)}))
    cases.append(rewritten("token_type=int", meta={"tokenizer.ggml.token_type": (3, V.INT32)}))
    for v, kind in ((huge, V.UINT32), (len(TOKENS), V.UINT32), (-1, V.INT32), ("2", V.STRING), (2.0, V.FLOAT32)):
        cases.append(rewritten(f"eos={v!r}", meta={"tokenizer.ggml.eos_token_id": (v, kind)}))
    cases.append(rewritten("tokenizer-model=llama", meta={"tokenizer.ggml.model": ("llama", V.STRING)}))
    cases.append(rewritten("tokenizer-model=int", meta={"tokenizer.ggml.model": (3, V.UINT32)}))
    cases.append(rewritten("pre=int", meta={"tokenizer.ggml.pre": (3, V.UINT32)}))
    cases.append(rewritten("chat-template=int", meta={"tokenizer.chat_template": (3, V.UINT32)}))
    cases.append(rewritten("name=int", wrong=False, meta={"general.name": (3, V.UINT32)}))

    # tensors: missing, extra, misshapen, the wrong dtype, NaN, a byte size that does not fit the type
    tensors = gguf_tensors(T.llama)
    for name in ("token_embd.weight", "blk.1.ffn_up.weight", "output_norm.weight", "blk.0.attn_k.weight"):
        cases.append(rewritten(f"missing-{name}", tensors={name: None}))
        t = tensors[name]
        cases.append(rewritten(f"transposed-{name}", tensors={name: np.ascontiguousarray(t.T if t.ndim == 2
                                                                                       else t[:-1])}))
        cases.append(rewritten(f"int32-{name}", tensors={name: t.astype(np.int32)}))
        nan = t.copy()
        nan.flat[3] = np.nan
        cases.append(rewritten(f"nan-{name}", tensors={name: nan}))
        inf = t.copy()
        inf.flat[0] = -np.inf
        cases.append(rewritten(f"inf-{name}", tensors={name: inf}))
    cases.append(rewritten("extra-blk.2", tensors={"blk.2.attn_norm.weight": tensors["blk.0.attn_norm.weight"]}))
    cases.append(rewritten("extra-bias", tensors={"blk.0.attn_q.bias": np.zeros(32, np.float32)}))
    cases.append(rewritten("extra-blk.99", tensors={f"blk.99.{k}": tensors[f"blk.1.{k}"] for k in GGUF_NAMES.values()}))
    cases.append(rewritten("blk.1-renamed-blk.7", tensors={f"blk.1.{k}": None for k in GGUF_NAMES.values()}
                           | {f"blk.7.{k}": tensors[f"blk.1.{k}"] for k in GGUF_NAMES.values()}))
    cases.append(rewritten("output-weight-wrong-shape", tensors={"output.weight": tensors["token_embd.weight"][:-1]}))
    up = tensors["blk.0.ffn_up.weight"]
    cases.append(rewritten("3d-tensor", tensors={"blk.0.ffn_up.weight": up.reshape(4, 16, 32)}))
    q8 = quants.quantize(tensors["blk.0.ffn_up.weight"], Q.Q8_0)
    cases.append(rewritten("q8-claims-another-shape", tensors={"blk.0.ffn_up.weight": (q8, (32, 68), Q.Q8_0)}))
    # random damage in the header and the metadata
    rng = random.Random("gguf")
    for i in range(40 + n_random):
        b, what = damaged(data, rng, (0, T.gguf_data_start))
        cases.append(from_bytes(f"random-{i}:{what}", b))
    # bit flips in the tensor data: sign and mantissa, so the weights stay finite and of their size (GGUF has
    # no checksums: other finite weights load, and so would 1e38 from a flipped exponent, whose logits overflow)
    for i in range(10):
        b = bytearray(data)
        at = rng.randrange(T.gguf_data_start, size - 4) // 4 * 4
        v = struct.unpack_from("<I", b, at)[0] ^ (1 << rng.choice([*range(23), 31]))
        struct.pack_into("<I", b, at, v)
        cases.append(from_bytes(f"data-flip-{i}", bytes(b)))
    return cases


def gguf_layout_q(T: Templates) -> list[tuple[str, int, int]]:
    path = write(T.root / "q-layout.gguf", T.gguf_q)
    return [x for x in gguf_layout(path)
            if x[0].split(".")[-1] in ("type", "offset", "dim0") and ("attn_q" in x[0] or "ffn_down" in x[0])]


# --- checkpoint and run directories -------------------------------------------------------------
CONFIG_FIELDS = ["vocab_size", "context", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "mlp", "activation",
                 "norm", "norm_eps", "norm_placement", "positions", "rope_theta", "bias", "tie_embeddings",
                 "dropout", "name"]


def config_values(field: str) -> list:
    """The hostile values of HOSTILE_JSON that are wrong for this ModelConfig field."""
    good_type = {"name": str, "mlp": str, "activation": str, "norm": str, "norm_placement": str, "positions": str,
                 "bias": bool, "tie_embeddings": bool}.get(field)
    if good_type is str:
        return [v for v in HOSTILE_JSON if v != "rope"] + ["x" * 10]
    if good_type is bool:
        return [v for v in HOSTILE_JSON if not isinstance(v, bool)]
    return [v for v in HOSTILE_JSON if not (field == "n_kv_heads" and v is None)]


def is_wrong(field: str, value) -> bool:
    """Whether a value is invalid for a ModelConfig field (every valid one of HOSTILE_JSON for a size or a
    choice also disagrees with the weights; a float may take any valid value)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if field in ("norm_eps", "rope_theta", "rms_norm_eps", "layer_norm_epsilon"):
        return not (number and value > 0 or value is None and field != "norm_eps")
    if field == "dropout":
        return not (number and 0 <= value < 1)
    if field == "name":
        return not isinstance(value, str)
    if field == "d_ff" and value is None:
        return False  # the default: 4 * d_model, what the tiny model has
    return True


def dir_case(family: str, what: str, files: dict[str, bytes], changes: dict[str, bytes | None], wrong: bool = False,
             same_weights: bool = False, sub: str = "") -> Case:
    def make(d: Path) -> Path:
        root = d / "model"
        for name, b in (files | changes).items():
            if b is not None:
                write(root / sub / name, b)
        return root

    return Case(family, what, make, wrong=wrong, same_weights=same_weights)


def state_bytes(state: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save(state, metadata={"format": "pt"})


def weights_cases(family: str, files: dict[str, bytes], weights: str, rng: random.Random, n: int) -> list[Case]:
    """Damage to one safetensors file: truncation, header bits, dtypes, shapes, missing/extra, NaN."""
    from safetensors.torch import load

    data = files[weights]
    header_end = 8 + int.from_bytes(data[:8], "little")
    cases = []
    for at in (0, 4, 7, 8, 9, header_end // 2, header_end - 1, header_end, header_end + 1, len(data) - 1):
        cases.append(dir_case(family, f"{weights}-truncated-{at}", files, {weights: data[:at]}))
    for v in (0, 2, header_end + 10**6, 2**63, 2**64 - 1):
        cases.append(dir_case(family, f"{weights}-header-len-{v}", files,
                              {weights: v.to_bytes(8, "little") + data[8:]}))
    for i in range(n):
        b, what = damaged(data, rng, (0, header_end))
        cases.append(dir_case(family, f"{weights}-{i}:{what}", files, {weights: b}))
    state = load(data)
    names = sorted(state)
    two_d = [k for k in names if state[k].ndim == 2]
    for name in rng.sample(names, 3):
        t = state[name]
        for what, new in (("missing", None), ("int32", t.to(torch.int32)), ("bool", t > 0),
                          ("int8", t.to(torch.int8)), ("first-row", t[:1].clone()),
                          ("nan", t.clone().index_fill_(0, torch.tensor([0]), math.nan)),
                          ("inf", t.clone().index_fill_(0, torch.tensor([0]), math.inf))):
            st = {k: v for k, v in state.items() if k != name} | ({} if new is None else {name: new})
            cases.append(dir_case(family, f"{weights}-{what}-{name}", files, {weights: state_bytes(st)}, wrong=True))
    t = state[two_d[0]]
    transposed = state_bytes(state | {two_d[0]: t.t().contiguous()})
    square = t.shape[0] == t.shape[1]
    cases.append(dir_case(family, f"{weights}-transposed", files, {weights: transposed}, wrong=not square))
    cases.append(dir_case(family, f"{weights}-extra", files,  # (Hugging Face files may hold tensors lumen ignores)
                          {weights: state_bytes(state | {"junk.weight": torch.zeros(2)})}, wrong=family != "hf"))
    cases.append(dir_case(family, f"{weights}-float16", files,
                          {weights: state_bytes({k: v.half() for k, v in state.items()})}))
    cases.append(dir_case(family, f"{weights}-empty", files, {weights: state_bytes({})}, wrong=True))
    cases.append(dir_case(family, f"{weights}-missing-file", files, {weights: None}))
    return cases


def text_cases(family: str, files: dict[str, bytes], name: str, rng: random.Random, n: int,
               sub: str = "") -> list[Case]:
    """A JSON file truncated, bit-flipped, not UTF-8, not JSON, of the wrong JSON type, empty, missing."""
    data = files[name]
    cases = [dir_case(family, f"{name}-empty", files, {name: b""}, sub=sub),
             dir_case(family, f"{name}-latin1", files, {name: data.replace(b'"', b'"\xe9', 1)}, sub=sub),
             dir_case(family, f"{name}-list", files, {name: b"[1, 2]"}, sub=sub),
             dir_case(family, f"{name}-null", files, {name: b"null"}, sub=sub),
             dir_case(family, f"{name}-string", files, {name: b'"config"'}, sub=sub),
             dir_case(family, f"{name}-nul-bytes", files, {name: b"\x00" * 64}, sub=sub)]
    for i in range(n):
        b, what = damaged(data, rng)
        cases.append(dir_case(family, f"{name}-{i}:{what}", files, {name: b}, sub=sub))
    return cases


def checkpoint_cases(T: Templates, n_random: int) -> list[Case]:
    rng = random.Random("checkpoint")
    files = T.ckpt
    cfg = json.loads(files["config.json"])
    cases = []
    for field in CONFIG_FIELDS:
        for v in rng.sample(config_values(field), 4):
            cases.append(dir_case("checkpoint", f"config.{field}={v!r}", files,
                                  {"config.json": json_bytes(cfg | {field: v})}, wrong=is_wrong(field, v)))
        cases.append(dir_case("checkpoint", f"config.{field}-missing", files,
                              {"config.json": json_bytes({k: v for k, v in cfg.items() if k != field})}))
    for field, v in (("n_layers", 1), ("n_layers", 3), ("n_layers", 2**31), ("d_model", 32), ("vocab_size", 10**6),
                     ("context", 2**40), ("norm", "rmsnorm"), ("positions", "rope"),
                     ("d_ff", 2**40), ("n_kv_heads", 1)):
        cases.append(dir_case("checkpoint", f"config.{field}={v}-disagrees", files,
                              {"config.json": json_bytes(cfg | {field: v})}, wrong=True))
    cases.append(dir_case("checkpoint", "config.unknown-key", files, {"config.json": json_bytes(cfg | {"x": 1})},
                          wrong=True))
    cases += text_cases("checkpoint", files, "config.json", rng, 15 + n_random // 4)
    cases += weights_cases("checkpoint", files, "model.safetensors", rng, 20 + n_random // 2)
    tok = json.loads(files["tokenizer.json"])
    for v in (7, None, ["a", "b"], "", "ab" * 40, {"a": 1}):
        cases.append(dir_case("checkpoint", f"tokenizer.chars={v!r}", files,
                              {"tokenizer.json": json_bytes(tok | {"chars": v})}, wrong=True))
    for v in ("bpe", 3, None):
        cases.append(dir_case("checkpoint", f"tokenizer.kind={v!r}", files,
                              {"tokenizer.json": json_bytes(tok | {"lumen_tokenizer": v})}, wrong=True))
    cases.append(dir_case("checkpoint", "tokenizer.duplicate-chars", files,
                          {"tokenizer.json": json_bytes(tok | {"chars": "aab"})}, wrong=True))
    cases.append(dir_case("checkpoint", "tokenizer-missing", files, {"tokenizer.json": None}))
    cases += text_cases("checkpoint", files, "tokenizer.json", rng, 8 + n_random // 4)
    # a run directory: best.json names the checkpoint to load
    best = json_bytes({"checkpoint": "step-1"})
    run = {f"checkpoints/step-1/{k}": v for k, v in files.items()} | {"best.json": best}
    for what, b in (("ok", best), ("invalid", b"{"), ("list", b"[]"), ("no-key", b"{}"), ("int", b'{"checkpoint": 3}'),
                    ("escape", b'{"checkpoint": "../../.."}'), ("missing-step", b'{"checkpoint": "step-9"}'),
                    ("latin1", b'{"checkpoint": "st\xe9p-1"}'), ("nul", b'{"checkpoint": "a\\u0000b"}')):
        cases.append(dir_case("checkpoint", f"run-best.json-{what}", run, {"best.json": b}))
    cases.append(dir_case("checkpoint", "run-stray-step-abc", run | {"checkpoints/step-abc/config.json": b"{}",
                                                                     "checkpoints/step-abc/model.safetensors": b""},
                          {"best.json": None}))
    return cases


# --- Hugging Face directories -------------------------------------------------------------------
HF_KEYS = {"vocab_size": "size", "hidden_size": "size", "intermediate_size": "size", "num_hidden_layers": "size",
           "num_attention_heads": "size", "num_key_value_heads": "size", "max_position_embeddings": "size",
           "head_dim": "size", "rms_norm_eps": "float", "rope_theta": "float", "tie_word_embeddings": "bool",
           "attention_bias": "bool", "model_type": "str", "hidden_act": "str", "rope_parameters": "dict"}


def hf_cases(T: Templates, n_random: int) -> list[Case]:
    from safetensors.torch import load

    rng = random.Random("hf")
    files = T.hf
    cfg = json.loads(files["config.json"])
    cases = [dir_case("hf", "valid", files, {}, same_weights=True)]
    for key, kind in HF_KEYS.items():
        values = [v for v in HOSTILE_JSON if kind != "bool" or not isinstance(v, bool)]
        for v in rng.sample(values, 4):
            wrong = is_wrong(key, v) and not (v in (None, {}) and key in (
                "num_key_value_heads", "head_dim", "rope_parameters", "attention_bias", "tie_word_embeddings"))
            cases.append(dir_case("hf", f"config.{key}={v!r}", files, {"config.json": json_bytes(cfg | {key: v})},
                                  wrong=wrong))
        cases.append(dir_case("hf", f"config.{key}-missing", files,
                              {"config.json": json_bytes({k: v for k, v in cfg.items() if k != key})}))
    for key, v in (("num_hidden_layers", 1), ("num_hidden_layers", 2**32 - 1), ("vocab_size", len(TOKENS) - 5),
                   ("max_position_embeddings", 2**40), ("intermediate_size", 2**40), ("hidden_size", 2**20),
                   ("num_attention_heads", 8), ("rope_parameters", {"rope_type": "default", "rope_theta": math.nan}),
                   ("rope_parameters", {"rope_type": "default", "rope_theta": "x"}), ("rope_parameters", "default"),
                   ("rope_scaling", "linear")):
        cases.append(dir_case("hf", f"config.{key}={v!r}-disagrees", files, {"config.json": json_bytes(cfg | {key: v})},
                              wrong=True))
    cases += text_cases("hf", files, "config.json", rng, 12 + n_random // 4)
    cases += weights_cases("hf", files, "model.safetensors", rng, 15 + n_random // 2)
    # stray and sharded weights files
    state = load(files["model.safetensors"])
    other = {k: torch.zeros_like(v) for k, v in state.items()}
    cases.append(dir_case("hf", "stray-extra-safetensors", files, {"zz-old.safetensors": state_bytes(other)},
                          same_weights=True))
    cases.append(dir_case("hf", "stray-partial-safetensors", files,
                          {"adapter.safetensors": state_bytes({k: other[k] for k in list(other)[:3]})},
                          same_weights=True))
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    sharded = {k: v for k, v in files.items() if k != "model.safetensors"}
    sharded |= {f: state_bytes({k: state[k] for k in ks}) for f, ks in shards.items()}
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    sharded["model.safetensors.index.json"] = json_bytes(index)
    cases.append(dir_case("hf", "sharded", sharded, {}, same_weights=True))
    cases.append(dir_case("hf", "sharded+stray", sharded, {"zz.safetensors": state_bytes(other)}, same_weights=True))
    wm = index["weight_map"]
    first = names[0]
    for what, idx in (("missing-shard", {"weight_map": wm | {first: "model-00003-of-00002.safetensors"}}),
                      ("escaping-shard", {"weight_map": wm | {first: "../../hf/model.safetensors"}}),
                      ("absolute-shard", {"weight_map": wm | {first: "/etc/passwd"}}),
                      ("wrong-shard", {"weight_map": wm | {first: "model-00002-of-00002.safetensors"}}),
                      ("no-map", {}), ("map-list", {"weight_map": [1]}), ("map-int-values", {"weight_map": {first: 3}}),
                      ("fewer-names", {"weight_map": {k: v for k, v in wm.items() if k != first}})):
        cases.append(dir_case("hf", f"index-{what}", sharded, {"model.safetensors.index.json": json_bytes(idx)}))
    cases += text_cases("hf", sharded, "model.safetensors.index.json", rng, 6)
    cases.append(dir_case("hf", "both-single-and-index", files | {"model.safetensors.index.json": json_bytes(index)},
                          {}))
    cases.append(dir_case("hf", "no-weights", files, {"model.safetensors": None}))
    cases.append(dir_case("hf", "only-stray-weights", files, {"model.safetensors": None,
                                                              "other.safetensors": files["model.safetensors"]}))
    # its tokenizer
    tok = json.loads(files["tokenizer.json"])
    bigger = dict(tok, model=dict(tok["model"], vocab=tok["model"]["vocab"] | {f"zz{i}": 10_000 + i for i in range(9)}))
    cases.append(dir_case("hf", "tokenizer-bigger-than-model", files, {"tokenizer.json": json_bytes(bigger)},
                          wrong=True))
    cases += text_cases("hf", files, "tokenizer.json", rng, 8 + n_random // 4)
    cases += text_cases("hf", files, "tokenizer_config.json", rng, 4)
    settings = json.loads(files["tokenizer_config.json"])
    for v in (3, ["<|im_end|>"], {"content": 3}, "no-such-token"):
        cases.append(dir_case("hf", f"tokenizer_config.eos={v!r}", files,
                              {"tokenizer_config.json": json_bytes(settings | {"eos_token": v})},
                              wrong=v != "no-such-token"))
    cases.append(dir_case("hf", "tokenizer_config.chat_template=3", files,
                          {"tokenizer_config.json": json_bytes(settings | {"chat_template": 3})}, wrong=True))
    return cases


# --- config.json and tuned lenses on their own --------------------------------------------------
def config_cases(T: Templates, n_random: int) -> list[Case]:
    rng = random.Random("config")
    cfg = json.loads(T.ckpt["config.json"])
    cases = []
    for field in CONFIG_FIELDS:
        for v in config_values(field)[::3][:4]:
            cases.append(dir_case("config", f"{field}={v!r}", {"config.json": json_bytes(cfg)},
                                  {"config.json": json_bytes(cfg | {field: v})}, wrong=is_wrong(field, v)))
    for what, v in (("vocab_size", 2**40), ("d_model", 2**40), ("n_layers", 2**40), ("context", 2**62),
                    ("n_heads", 3), ("n_kv_heads", 16), ("d_model", 2**20 + 1)):
        cases.append(dir_case("config", f"{what}={v}", {"config.json": b""},
                              {"config.json": json_bytes(cfg | {what: v})}, wrong=True))
    cases += text_cases("config", {"config.json": T.ckpt["config.json"]}, "config.json", rng, 10 + n_random)
    return cases


def lens_cases(T: Templates, n_random: int) -> list[Case]:
    from safetensors import safe_open
    from safetensors.torch import load, save

    rng = random.Random("lens")
    data = T.lens
    files = {"lens.safetensors": data}
    with safe_open(str(write(T.root / "lens-meta.safetensors", data)), "pt") as f:
        meta = f.metadata()
    state = load(data)
    cases = [dir_case("lens", "valid", files, {})]
    header_end = 8 + int.from_bytes(data[:8], "little")
    for i in range(15 + n_random // 2):
        b, what = damaged(data, rng, (0, header_end) if i % 2 else None)
        cases.append(dir_case("lens", f"{i}:{what}", files, {"lens.safetensors": b}))
    for key, v in (("n_layers", "abc"), ("n_layers", "3"), ("n_layers", "-1"), ("n_layers", "1e9"), ("kind", "x"),
                   ("unembedding_sha256", "0" * 64), ("d_model", "abc")):
        b = save(state, metadata=meta | {key: v})
        cases.append(dir_case("lens", f"meta.{key}={v}", files, {"lens.safetensors": b},
                              wrong=not (key == "d_model")))
    name = sorted(state)[0]
    for what, new in (("missing", None), ("int", state[name].int()), ("shape", state[name][:1].clone()),
                      ("nan", state[name].clone().fill_(math.nan))):
        st = {k: v for k, v in state.items() if k != name} | ({} if new is None else {name: new})
        cases.append(dir_case("lens", f"{what}-{name}", files, {"lens.safetensors": save(st, metadata=meta)},
                              wrong=True))
    st = state | {"9.lin.weight": state["0.lin.weight"].clone()}
    cases.append(dir_case("lens", "extra-translator", files, {"lens.safetensors": save(st, metadata=meta)}, wrong=True))
    return cases


# ---------------------------------------------------------------------------------------------
# loading, and what "works" means
def load_case(case: Case, spec: Path, T: Templates) -> None:
    """Load the input; if it loads, check that what came back works (else AssertionError)."""
    if case.family in ("gguf", "checkpoint", "hf"):
        loaded = load(spec)
        model, tok = loaded.model, loaded.tokenizer
        with torch.no_grad():
            logits = model(IDS[:, : model.cfg.context])[0]
        assert torch.isfinite(logits).all(), "loaded a model whose logits are not finite"
        if tok is not None:
            assert tok.vocab_size <= model.cfg.vocab_size, "a tokenizer larger than the model's vocabulary"
            text = tok.decode(range(min(8, tok.vocab_size)))
            assert all(0 <= i < model.cfg.vocab_size for i in tok.encode(text)), "token ids out of range"
        if case.same_weights:
            ref = T.logits["llama_untied" if case.family == "hf" else case.family if case.family != "gguf" else "llama"]
            torch.testing.assert_close(logits.float(), ref, rtol=1e-4, atol=1e-5, msg="the weights changed")
    elif case.family == "config":
        cfg = ModelConfig.load(spec / "config.json")
        with torch.device("meta"):
            GPT(cfg)
    elif case.family == "lens":
        lens = TunedLens.load(spec / "lens.safetensors", T.gpt2)
        with torch.no_grad():
            out = lens(torch.randn(1, 3, T.gpt2.cfg.d_model), 0)
        assert torch.isfinite(out).all(), "a lens that gives non-finite logits"
    else:
        raise AssertionError(case.family)


class Wrong(AssertionError):
    """Loaded, though wrong (or not working)."""


def run_case(case: Case, folder: Path, T: Templates) -> str:
    """'refused' or 'works'; raises Wrong, AssertionError (an unnamed error) or whatever escaped."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = case.make(folder)
    try:
        load_case(case, spec, T)
    except LumenError as e:
        msg = str(e)
        named = spec.name in msg or (case.family in ("config", "lens") and folder.name in msg)
        assert named and "\n" not in msg, f"{case}: the error does not name {spec.name} in one line: {msg}"
        return "refused"
    except AssertionError as e:
        raise Wrong(f"{case}: {e}") from None
    if case.wrong:
        raise Wrong(f"{case}: loaded although wrong by construction")
    return "works"


FAMILIES = {"gguf": gguf_cases, "checkpoint": checkpoint_cases, "hf": hf_cases, "config": config_cases,
            "lens": lens_cases}


def all_cases(T: Templates, n_random: int = EXTRA) -> list[Case]:
    return [c for make in FAMILIES.values() for c in make(T, n_random)]


@functools.cache
def templates() -> Templates:
    """The valid inputs, written once per session into a temporary folder when a test first asks (never at
    collection: `pytest --collect-only` builds nothing)."""
    root = Path(tempfile.mkdtemp(prefix="lumen-fuzz-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return Templates(root / "templates")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and does not fight the other tests' threads for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Hung(BaseException):
    """A case ran past CASE_SECONDS (a BaseException: no `except Exception` in lumen swallows it)."""


def _alarm(signum, frame):
    raise Hung(f"a case ran past {CASE_SECONDS} s")


def outcome(case: Case, folder: Path, T: Templates) -> str:
    """'refused' or 'works', else what went wrong: 'wrong: ...', 'escaped: TYPE: ...' or 'hung'."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        return run_case(case, folder, T)
    except Hung:
        return "hung"
    except AssertionError as e:  # Wrong, or an error that does not name the file in one line
        return f"wrong: {e}"
    except Exception as e:  # noqa: BLE001 - what the property forbids
        return f"escaped: {type(e).__name__}: {_first_line(e)}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


@pytest.mark.parametrize("family", FAMILIES)
def test_damaged_files_are_refused_or_work(family, tmp_path):
    """Every case of one family (built now, from the templates); the failures are listed together."""
    T = templates()
    failures = []
    for i, case in enumerate(FAMILIES[family](T, EXTRA)):
        result = outcome(case, tmp_path / str(i), T)
        if TALLY:
            with open(TALLY, "a") as f:
                f.write(json.dumps({"family": family, "case": repr(case), "outcome": result}) + "\n")
        elif result not in ("refused", "works"):
            failures.append(f"{i}-{case!r}: {result}")
    assert not failures, f"{len(failures)} case(s) failed:\n" + "\n".join(failures[:30])
