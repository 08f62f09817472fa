"""lumen reads a GGUF file's header itself (formats.gguf.open_gguf: one checked pass over the bytes, strings
decoded straight into Python lists), never building the gguf package's reader with its many small arrays.
What it reads must be what that reader reads: every metadata field (value and Python type), the tokenizer
built from them, every tensor's name, type, dimensions and bytes, on small files written here with every
value type and several quantizations, and on SmolLM2's real file (slow). And the point of it: reading
SmolLM2's header costs a child process far less memory than the gguf package's reader did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, quants

from helpers.damaged import write_gguf
from helpers.gguf import tiny_model
from lumen.formats.gguf import dequantize, open_gguf, read_header, tokenizer_from_gguf

V = GGUFValueType

# one metadata field of every value type, and arrays of each kind of item (unicode, an empty string, extremes)
EVERY_TYPE = {
    "test.u8": (255, V.UINT8), "test.i8": (-128, V.INT8), "test.u16": (65535, V.UINT16), "test.i16": (-32768, V.INT16),
    "test.u32": (2**32 - 1, V.UINT32), "test.i32": (-(2**31), V.INT32), "test.f32": (0.1, V.FLOAT32),
    "test.bool": (True, V.BOOL), "test.false": (False, V.BOOL), "test.u64": (2**64 - 1, V.UINT64),
    "test.i64": (-(2**63), V.INT64), "test.f64": (0.1, V.FLOAT64), "test.text": ("naïve — 東京 🙂", V.STRING),
    "test.empty": ("", V.STRING), "test.ints": ([1, -2, 3], V.ARRAY, V.INT32),
    "test.u64s": ([0, 2**64 - 1], V.ARRAY, V.UINT64), "test.floats": ([0.5, -1e-3, 3e38], V.ARRAY, V.FLOAT32),
    "test.doubles": ([1e-300, -2.5], V.ARRAY, V.FLOAT64), "test.bools": ([True, False, True], V.ARRAY, V.BOOL),
    "test.texts": (["a", "", "Ġthe", "ü"], V.ARRAY, V.STRING),
}
# GGUF names -> types: the blocks lumen keeps (Q8_0, Q4_1) and ones it dequantizes (F16, BF16, Q4_0, Q5_0, F32)
TYPES = {"token_embd.weight": Q.Q8_0, "blk.0.attn_q.weight": Q.Q4_1, "blk.0.ffn_up.weight": Q.F16,
         "blk.0.ffn_down.weight": Q.BF16, "blk.1.attn_k.weight": Q.Q4_0, "blk.1.ffn_gate.weight": Q.Q5_0}


def the_package_reads(path: Path) -> tuple[dict, list]:
    """(metadata, tensors) as the gguf package's GGUFReader reads them (its GGUF.* entries are the header's
    counts and version, not metadata)."""
    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return meta, [(t.name, t.tensor_type, [int(n) for n in t.shape], t.data) for t in r.tensors]


def kinds(value) -> object:
    """The Python types of a value and of each of its items (a bool must stay a bool, not become an int)."""
    return [type(x).__name__ for x in value] if isinstance(value, list) else type(value).__name__


def assert_reads_as_the_package(path: Path) -> None:
    ours = open_gguf(path)
    meta, tensors = the_package_reads(path)
    assert ours.meta == meta
    assert {k: kinds(v) for k, v in ours.meta.items()} == {k: kinds(v) for k, v in meta.items()}
    assert [(t.name, t.tensor_type, list(t.shape)) for t in ours.tensors] == [x[:3] for x in tensors]
    for t, (name, kind, _, data) in zip(ours.tensors, tensors):
        assert t.data.tobytes() == np.ascontiguousarray(data).tobytes(), name
        np.testing.assert_array_equal(dequantize(t), quants.dequantize(data, kind), err_msg=name)
    ours_tok, their_tok = tokenizer_from_gguf(ours.meta), tokenizer_from_gguf(meta)
    assert ours_tok.tok.get_vocab(with_added_tokens=True) == their_tok.tok.get_vocab(with_added_tokens=True)
    assert ours_tok.eos_id == their_tok.eos_id and ours_tok.chat_template == their_tok.chat_template


def test_every_value_type_and_quantization_reads_as_the_package(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tiny_model(), meta=EVERY_TYPE, types=TYPES)
    assert_reads_as_the_package(path)
    meta = open_gguf(path).meta  # (and the values are the ones written, to float32's rounding for f32)
    assert meta["test.u64"] == 2**64 - 1 and meta["test.i8"] == -128 and meta["test.bool"] is True
    assert meta["test.f32"] == float(np.float32(0.1)) and meta["test.f64"] == 0.1
    assert meta["test.texts"] == ["a", "", "Ġthe", "ü"] and meta["test.text"] == "naïve — 東京 🙂"


def test_read_header_drops_the_metadata_once_read(tmp_path):
    """The config and tokenizer are built from the metadata; the file it returns keeps only the tensors."""
    path = write_gguf(tmp_path / "m.gguf", tiny_model())
    file, cfg, tok = read_header(path)
    assert file.meta == {} and len(file.tensors) == len(open_gguf(path).tensors)
    assert cfg.n_layers == 2 and tok.vocab_size == cfg.vocab_size


@pytest.mark.slow
def test_smollm2_reads_as_the_package(smollm2_gguf):
    assert_reads_as_the_package(smollm2_gguf)


# (peak resident memory of reading the header, over what the process held just before: SmolLM2's vocabulary
# and merges as the gguf package's reader parses them, ~100k small arrays, cost twice the bound and more)
PEAK = """
import sys
sys.path.insert(0, sys.argv[2])
from rss import reset_peak, status_kib
from lumen.formats.gguf import read_header
before = status_kib("VmRSS")
reset_peak()
read_header(sys.argv[1])
print((status_kib("VmHWM") - before) / 1024)
"""


@pytest.mark.slow
def test_reading_smollm2s_header_takes_little_memory(smollm2_gguf):
    """In a child process (its own high-water mark): under 100 MiB for the header, the tokenizer built."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("no /proc/self/clear_refs to reset the high-water mark (Linux only)")
    out = subprocess.run([sys.executable, "-c", PEAK, str(smollm2_gguf), str(bench)], capture_output=True,
                         text=True, check=True)
    peak = json.loads(out.stdout.strip().splitlines()[-1])
    assert peak < 100, f"reading the header raised the peak by {peak:.0f} MiB"


# (a child process: this one has imported the compiler long ago)
NO_COMPILER = """
import sys
from lumen.fast import load_quantized
from lumen.formats import load
load(sys.argv[1]), load_quantized(sys.argv[1])
print([m for m in ("torch._dynamo", "torch._inductor", "sympy") if m in sys.modules])
"""


@pytest.mark.slow
def test_loading_a_gguf_imports_no_compiler(tmp_path):
    """Building the model (GPT.template: shapes on the meta device, nothing drawn) brings in none of torch's
    compiler (tens of MiB resident), which a process that decodes from a compiled package never needs."""
    path = write_gguf(tmp_path / "m.gguf", tiny_model(), types={"blk.0.attn_q.weight": Q.Q8_0})
    out = subprocess.run([sys.executable, "-c", NO_COMPILER, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
