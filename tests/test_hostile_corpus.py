"""A corpus of the memory-safety bug classes that model-file parsers have had, as small files written here (no
binary blobs in the repository): llama.cpp's GGUF CVEs (integer overflows in tensor counts, dimensions and
sizes: CVE-2025-53630 and its bypass CVE-2026-27940; string and token lengths past the file: the class of
CVE-2024-23496 and CVE-2025-49847; offsets past the end or wrapping, and offsets that disagree with the
running size), and safetensors' header bounds (a header length past the file, offsets outside the data or
overlapping, shapes whose byte size disagrees with the span).

lumen parses GGUF headers itself (formats.gguf's header walk; the gguf package only names the types and
dequantizes), so each class is lumen's to refuse. Every file must be refused in one line naming it: for GGUF by
lumen's header walk, allocating next to nothing; through the real `lumen` command, in a child process whose
address space is capped (nothing may allocate more than MEMORY_BOUND for a claimed size) and whose time is
bounded.

    python tests/test_hostile_corpus.py OUT_DIR     # write the corpus out, to try it on other tools
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import tracemalloc
from pathlib import Path

import pytest

from lumen.errors import LumenError

MEMORY_BOUND = 256 << 20  # bytes the command may allocate beyond what an idle lumen process holds
SECONDS = 20

# ---------------------------------------------------------------------------------------------
# GGUF, byte by byte (gguf's own writer refuses to write most of these)
F32, F16, ALIGN = 0, 1, 32
STRING, ARRAY, UINT32, UINT64 = 8, 9, 4, 10


def u32(n: int) -> bytes:
    return struct.pack("<I", n % 2**32)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n % 2**64)


def gstr(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw) if length is None else length) + raw


def kv(key: str | bytes, kind: int, value: bytes, key_length: int | None = None) -> bytes:
    return gstr(key, key_length) + u32(kind) + value


def tensor(name: str, dims: list[int], kind: int = F32, offset: int = 0, n_dims: int | None = None) -> bytes:
    return gstr(name) + u32(len(dims) if n_dims is None else n_dims) + b"".join(u64(d) for d in dims) + u32(kind) + \
        u64(offset)


def gguf(kvs: list[bytes] | None = None, tensors: list[bytes] | None = None, data: bytes | None = None,
         n_tensors: int | None = None, n_kv: int | None = None, version: int = 3, align: int = ALIGN) -> bytes:
    """A GGUF file: header, metadata, tensor records, padding to the alignment, data. By default two float32
    tensors of 32 values, 4x8 and 32, stored one after the other (128 bytes each: a multiple of the alignment,
    so a changed type shows in the layout even for the last one)."""
    kvs = [kv("general.architecture", STRING, gstr("llama"))] if kvs is None else kvs
    if tensors is None:
        tensors = [tensor("token_embd.weight", [8, 4]), tensor("output_norm.weight", [32], offset=128)]
    data = bytes(256) if data is None else data
    head = b"GGUF" + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors) + \
        u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tensors)
    return head + bytes(-len(head) % align) + data


def tokens(items: list[bytes], count: int | None = None) -> bytes:
    """tokenizer.ggml.tokens: an array of strings, each given as its raw (length-prefixed) bytes."""
    n = len(items) if count is None else count
    return kv("tokenizer.ggml.tokens", ARRAY, u32(STRING) + u64(n) + b"".join(items))


def gguf_corpus() -> dict[str, bytes]:
    base = gguf()
    two = [tensor("token_embd.weight", [8, 4]), tensor("output_norm.weight", [32], offset=128)]
    corpus = {
        # counts whose products overflow a size (CVE-2025-53630, CVE-2026-27940: n_tensors x sizeof wraps)
        "tensor-count-2^64-1": gguf(n_tensors=2**64 - 1),
        "tensor-count-wraps-x8": gguf(n_tensors=2**61 + 1),
        "tensor-count-wraps-x368": gguf(n_tensors=2**64 // 368 + 1),
        "kv-count-2^63": gguf(n_kv=2**63),
        "kv-count-wraps": gguf(n_kv=2**60 + 1),
        # string lengths past the file, or wrapping when 1 is added (CVE-2024-23496's class)
        "key-length-2^64-1": gguf(kvs=[kv("general.architecture", STRING, gstr("llama"), key_length=2**64 - 1)]),
        "key-length-past-file": gguf(kvs=[kv("general.architecture", STRING, gstr("llama"), key_length=10**6)]),
        "value-length-2^64-1": gguf(kvs=[kv("general.architecture", STRING, gstr("llama", 2**64 - 1))]),
        "key-not-utf8": gguf(kvs=[kv(b"general.\xff\xfe", STRING, gstr("llama"))]),
        # a vocabulary token whose length runs past the file (CVE-2025-49847's class), token counts that wrap
        "token-length-past-file": gguf(kvs=[tokens([gstr("a"), gstr("b", 2**40)])]),
        "token-length-2^64-1": gguf(kvs=[tokens([gstr("a", 2**64 - 1)])]),
        "token-count-2^64-1": gguf(kvs=[tokens([gstr("a")], count=2**64 - 1)]),
        "token-count-wraps-x8": gguf(kvs=[tokens([gstr("a")], count=2**61 + 1)]),
        "u64-array-wraps-x8": gguf(kvs=[kv("x.sizes", ARRAY, u32(UINT64) + u64(2**61 + 1) + u64(7))]),
        "array-of-arrays": gguf(kvs=[kv("x.nested", ARRAY, u32(ARRAY) + u64(1) + u32(UINT32) + u64(1) + u32(7))]),
        "array-item-type-99": gguf(kvs=[kv("x.odd", ARRAY, u32(99) + u64(1) + u32(7))]),
        "value-type-99": gguf(kvs=[kv("x.odd", 99, u32(7))]),
        "key-twice": gguf(kvs=[kv("general.architecture", STRING, gstr("llama"))] * 2),
        # dimensions: too many, zero, and products past 2^63 elements or 2^64 bytes
        "n-dims-5": gguf(tensors=[tensor("t", [1, 1, 1, 1, 1])]),
        "n-dims-2^32-1": gguf(tensors=[tensor("t", [8], n_dims=2**32 - 1)]),
        "dim-zero": gguf(tensors=[tensor("t", [8, 0])]),
        "dims-product-2^64": gguf(tensors=[tensor("t", [2**32, 2**32])]),
        "dims-product-2^63": gguf(tensors=[tensor("t", [2**31, 2**32])]),
        "dims-bytes-past-2^64": gguf(tensors=[tensor("t", [2**62, 4])]),
        "dim-2^64-1": gguf(tensors=[tensor("t", [2**64 - 1])]),
        "type-id-9999": gguf(tensors=[tensor("t", [8], kind=9999)]),
        "type-id-negative": gguf(tensors=[tensor("t", [8], kind=2**32 - 1)]),
        # offsets: past the end, wrapping, misaligned, overlapping, with a gap, disagreeing with a changed type
        "offset-past-end": gguf(tensors=[two[0], tensor("output_norm.weight", [32], offset=2**40)]),
        "offset-wraps": gguf(tensors=[two[0], tensor("output_norm.weight", [32], offset=2**64 - 32)]),
        "offset-wraps-to-first": gguf(tensors=[two[0], tensor("output_norm.weight", [32], offset=2**64)]),
        "offset-misaligned": gguf(tensors=[two[0], tensor("output_norm.weight", [32], offset=129)]),
        "offset-overlaps": gguf(tensors=[two[0], tensor("output_norm.weight", [32], offset=96)]),
        "offset-gap": gguf(tensors=[two[0], tensor("output_norm.weight", [32], offset=160)], data=bytes(288)),
        "first-offset-not-0": gguf(tensors=[tensor("token_embd.weight", [8, 4], offset=32), two[1]]),
        "type-changed-to-f16": gguf(tensors=[tensor("token_embd.weight", [8, 4], kind=F16), two[1]]),
        "last-type-changed-to-f16": gguf(tensors=[two[0], tensor("output_norm.weight", [32], kind=F16, offset=128)]),
        "tensor-twice": gguf(tensors=[two[0], tensor("token_embd.weight", [32], offset=128)]),
        "trailing-bytes": base + bytes(4096),
        # alignment: zero, not a power of two, so large the data starts past the file
        "alignment-0": gguf(kvs=[kv("general.alignment", UINT32, u32(0))]),
        "alignment-3": gguf(kvs=[kv("general.alignment", UINT32, u32(3))]),
        "alignment-2^31": gguf(kvs=[kv("general.alignment", UINT32, u32(2**31))]),
        # versions and truncation
        "version-4": gguf(version=4),
        "version-big-endian": gguf(version=0x03000000),
        "not-gguf": b"GGML" + base[4:],
        "empty": b"",
    }
    for cut in (3, 7, 15, 23, 40, len(base) - 200, len(base) - 1):
        corpus[f"truncated-at-{cut}"] = base[:cut]
    return corpus


# ---------------------------------------------------------------------------------------------
# safetensors: an 8-byte header length, a JSON header, the data
def safetensors(header: dict | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return u64(len(raw) if length is None else length) + raw + data


def safetensors_corpus(state: dict) -> dict[str, bytes]:
    """Damaged copies of a real checkpoint's model.safetensors (`state`: its tensors, as torch writes them)."""
    from safetensors.torch import save

    good = save(state)
    header_len = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + header_len])
    data = good[8 + header_len:]
    names = sorted(k for k in header if k != "__metadata__")
    a, b = names[0], names[1]

    def changed(name: str, **entry) -> dict:
        return header | {name: header[name] | entry}

    span = header[a]["data_offsets"]
    return {
        "header-length-2^64-1": safetensors(header, data, length=2**64 - 1),
        "header-length-past-file": safetensors(header, data, length=len(good)),
        "header-length-200MB": safetensors(header, data, length=200 << 20),
        "header-not-json": safetensors(b"{" + bytes(header_len - 1), data),
        "header-not-utf8": safetensors(b'{"\xff": 1}' + bytes(header_len - 9), data),
        "offsets-past-end": safetensors(changed(a, data_offsets=[span[0], len(data) + 4096]), data),
        "offsets-2^64": safetensors(changed(a, data_offsets=[span[0], 2**64 - 1]), data),
        "offsets-reversed": safetensors(changed(a, data_offsets=[span[1], span[0]]), data),
        "offsets-overlap": safetensors(changed(b, data_offsets=header[a]["data_offsets"]), data),
        "shape-disagrees": safetensors(changed(a, shape=[x * 2 for x in header[a]["shape"]]), data),
        "shape-product-overflows": safetensors(changed(a, shape=[2**32, 2**32, 2**32]), data),
        "dtype-unknown": safetensors(changed(a, dtype="F7"), data),
        "dtype-shrunk": safetensors(changed(a, dtype="F16"), data),
        "data-truncated": good[:-64],
        "empty": b"",
        "only-the-length": u64(10),
    }


# ---------------------------------------------------------------------------------------------
# the files on disk: GGUF files as they are, safetensors as the weights of a lumen checkpoint
def write_corpus(root: Path) -> dict[str, Path]:
    """Write every case under root; name -> the spec `lumen generate` is given for it."""
    from helpers.damaged import templates
    from lumen.formats.checkpoint import save_checkpoint

    T = templates()
    specs = {}
    root.mkdir(parents=True, exist_ok=True)
    for name, data in gguf_corpus().items():
        path = root / f"{name}.gguf"
        path.write_bytes(data)
        specs[f"gguf:{name}"] = path
    model, tok = T.gpt2, T.chars
    ckpt = save_checkpoint(root / "good-checkpoint", model, tok)
    from safetensors.torch import load_file

    state = load_file(str(ckpt / "model.safetensors"))
    for name, data in safetensors_corpus(state).items():
        folder = save_checkpoint(root / f"st-{name}", model, tok)
        (folder / "manifest.json").unlink()  # (loading does not verify the manifest; resuming does)
        (folder / "model.safetensors").write_bytes(data)
        specs[f"safetensors:{name}"] = folder
    return specs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("hostile-corpus"))


# ---------------------------------------------------------------------------------------------
def test_the_base_files_are_valid(tmp_path):
    """The unmutated GGUF passes the header walk, so each case is refused for its own damage."""
    from lumen.formats.gguf import check_layout

    (tmp_path / "base.gguf").write_bytes(gguf())
    check_layout(tmp_path / "base.gguf")


@pytest.mark.parametrize("name", sorted(gguf_corpus()))
def test_gguf_case_is_refused_by_the_header_walk(name, tmp_path):
    """Refused by lumen's own walk, in one line naming the file, allocating no more than a small bound
    (Python's and numpy's allocations, traced)."""
    from lumen.formats.gguf import open_gguf

    path = tmp_path / f"{name}.gguf"
    path.write_bytes(gguf_corpus()[name])
    tracemalloc.start()
    try:
        with pytest.raises(LumenError) as e:
            open_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert path.name in msg and "\n" not in msg, msg
    assert peak < 1 << 20, f"{peak:,} bytes allocated to refuse a {path.stat().st_size:,}-byte file"


def run_all(specs: dict[str, Path]) -> dict[str, str]:
    """`lumen generate SPEC` (one token) for every case, in this process: name -> "refused: LINE", "ok",
    "exit N: LINE"."""
    import contextlib
    import io

    from lumen.cli import main

    out = {}
    for name, spec in specs.items():
        err = io.StringIO()
        signal.alarm(SECONDS)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                rc = main(["generate", str(spec), "--prompt", "x", "--max-new-tokens", "1"])
        except BaseException as e:  # noqa: BLE001 - reported, not raised: the child must answer
            rc, err = -1, io.StringIO(f"{type(e).__name__}: {e}")
        finally:
            signal.alarm(0)
        last = (err.getvalue().strip().splitlines() or [""])[-1]
        out[name] = f"refused: {last}" if rc == 2 else "ok" if rc == 0 else f"exit {rc}: {last}"
    return out


def test_every_case_is_refused_by_the_command_within_a_memory_bound(corpus):
    """Through `lumen generate`, which reads the weights, in a forked child whose address space may grow by
    MEMORY_BOUND at most (an allocation for a claimed size fails there, and shows as an internal error) and
    whose every case has SECONDS: each case exits 2 with one line naming its file."""
    import resource

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            with open("/proc/self/statm") as f:
                now = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (now + MEMORY_BOUND, resource.RLIM_INFINITY))
            result = json.dumps(run_all(corpus))
        except BaseException as e:  # noqa: BLE001
            result = json.dumps({"child": f"{type(e).__name__}: {e}"})
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child died (signal {os.WTERMSIG(status)})"
    results = json.loads(raw)
    bad = {n: r for n, r in results.items()
           if not (r.startswith("refused: lumen generate: error: ") and Path(corpus[n]).name in r)}
    assert not bad, "\n".join(f"{n}: {r}" for n, r in bad.items())
    assert len(results) == len(corpus)


if __name__ == "__main__":  # write the corpus out
    sys.path.insert(0, str(Path(__file__).parent))
    for name, spec in write_corpus(Path(sys.argv[1])).items():
        print(f"{name:40} {spec}")
