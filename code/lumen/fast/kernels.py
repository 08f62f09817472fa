"""The speed wing's kernels: the C++ library it builds and loads, and every op it gives torch (`lumen::`).

One library holds the CPU kernels of three kinds of op: a decoded token's product with a GGUF matrix kept in
quads (`lumen::q4_1_row`, `lumen::q8_0_row`: quant.cpp over quads.h's arithmetic; quant.py's QuantMatrix calls
them), a prompt's, each row rounded as a token's (`lumen::q4_1_rows`, `lumen::q8_0_rows`), and one query's
attention over the slots it may see (`lumen::attend_one`: attend.cpp over attend.h; attention.py's
OneQueryAttention calls it). Their schemas and shapes are defined here, so a graph traces them whether or not
the library is loaded; `load()` builds it the first time on a machine (torch.utils.cpp_extension, ~30 s), into
the lumen cache, and later processes only load it. Where it does not build, the callers compute the same
formulas in torch (slower), and `loaded()` says which runs. Two more ops are torch's own code written as ops
that torch.compile calls as they are: `stored` and `onednn_linear`. An AOTInductor package calls the kernels
as the library's C functions (`c_shims`, aot.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from ..files import atomic_path
from ..runtime import cpu
from ..runtime.cache import cache_dir
from .quads import ROWS

# x @ w.T for one float32 row x (in,) and a matrix in quads (quads.py): (4 * quads,), the rows past the
# matrix's zeros
for _kind in ("q4_1", "q8_0"):
    torch.library.define(f"lumen::{_kind}_row", "(Tensor x, Tensor quads) -> Tensor")

    @torch.library.register_fake(f"lumen::{_kind}_row")
    def _(x: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
        return x.new_empty(ROWS * quads.shape[0])

    # the same for many float32 rows x (m, in), each rounded as one row is: (m, 4 * quads)
    torch.library.define(f"lumen::{_kind}_rows", "(Tensor x, Tensor quads) -> Tensor")

    @torch.library.register_fake(f"lumen::{_kind}_rows")
    def _(x: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], ROWS * quads.shape[0])


# one query (B, h, 1, hd) against a cache's keys and values (B, h_kv, S, hd), over the slots allowed (1, S)
torch.library.define("lumen::attend_one", "(Tensor q, Tensor k, Tensor v, Tensor allowed) -> Tensor")


@torch.library.register_fake("lumen::attend_one")
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q)


def row_product(x: torch.Tensor, quads: torch.Tensor, kind: str) -> torch.Tensor:
    """quant.cpp's x @ w.T for one float32 row x (in,) and a Q4_1 or Q8_0 matrix in quads: (4 * quads,)."""
    product = torch.ops.lumen.q4_1_row if kind == "Q4_1" else torch.ops.lumen.q8_0_row
    return product(x, quads)


def rows_product(x: torch.Tensor, quads: torch.Tensor, kind: str) -> torch.Tensor:
    """quant.cpp's x @ w.T for float32 rows x (m, in), each row's numbers those `row_product` gives it alone:
    (m, 4 * quads)."""
    product = torch.ops.lumen.q4_1_rows if kind == "Q4_1" else torch.ops.lumen.q8_0_rows
    return product(x, quads)


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """attend.cpp's attention of one query (B, h, 1, hd), float32, hd a multiple of 8, over the cache's slots
    allowed (1, S): (B, h, 1, hd)."""
    return torch.ops.lumen.attend_one(q, k, v, allowed)


@torch.library.custom_op("lumen::stored", mutates_args=())
def stored(x: torch.Tensor) -> torch.Tensor:
    """x, written out to memory. A product of one row reads each input number once per output row, and
    torch.compile folds a cheap producer into the loop that reads it: the final norm before the
    unembedding would be computed again for each of its 49,152 rows (a third of a token's time).
    `QuantMatrix.rounded_row_product` goes through this op, which the compiler cannot look into."""
    return x.clone()


@stored.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("lumen::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias by oneDNN, the plain weight reordered on the fly: for a float32 prompt faster
    than F.linear's product on CPUs (docs/speed.md), the same numbers to float32 rounding. A custom
    op, so that torch.compile calls it as it is (its own lowering takes only weights frozen into the graph)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.size(0)))


# ---------------------------------------------------------------------------------------------
# the library: the products and the attention in one; their arithmetic is the headers' (no torch in them: a
# test also builds them for ARM64 and runs them under emulation)
SOURCES = (Path(__file__).with_name("quant.cpp"), Path(__file__).with_name("attend.cpp"))
HEADERS = (Path(__file__).with_name("quads.h"), Path(__file__).with_name("attend.h"))
# How far ahead of its reads a block product asks for memory (quads.h's LUMEN_AHEAD_BYTES), by the CPU's maker,
# as measured (docs/speed.md): AMD's Zen 5 best at 16 KiB (quads.h's default), Intel's Sapphire Rapids at 2 KiB
# (at 16 KiB a token's products took ~30% more CPU time there)
AHEAD_BYTES = {"GenuineIntel": 2048, "AuthenticAMD": 16384}


def ahead_flags() -> list[str]:
    """The prefetch distance for this CPU's maker as a compiler flag (none for a maker not measured)."""
    ahead = AHEAD_BYTES.get(cpu.vendor())
    return [] if ahead is None else [f"-DLUMEN_AHEAD_BYTES={ahead}"]


def march() -> list[str]:
    """The instructions to build for: this CPU's own (-march=native), or, where $LUMEN_CPU_FLAGS names an x86-64
    CPU without AVX-512 (lumen.runtime.cpu: lumen deciding as on such a CPU), the AVX2 level such a CPU has
    (-march=x86-64-v3, with AVX-VNNI where named): the kernels it would run, run here."""
    if os.environ.get(cpu.OVERRIDE) is None or cpu.arch() != "x86_64" or cpu.has("avx512f", "avx512bw", "avx512_vnni"):
        return ["-march=native"]
    return ["-march=x86-64-v3", *(["-mavxvnni"] if cpu.has("avx_vnni") else [])]


# OpenMP too: ATen's parallel_for is written in its headers as an OpenMP loop, so a kernel built without it
# runs every row on one thread whatever torch.set_num_threads says
CFLAGS = ["-O3", *march(), "-fopenmp", *ahead_flags()]

_library: bool | None = None  # not yet tried, built and loaded, or unavailable here


def load() -> bool:
    """Whether the library is loaded: built the first time on this machine (g++ and ninja, -march=native, or
    `march`'s: x86-64 with AVX2 and FMA, or ARM64 with NEON; ~30 s) into the lumen cache, keyed by the sources,
    the flags, torch's version and the CPU; tried once a process."""
    global _library
    if _library is None:
        _library = _load()
    return _library


def loaded() -> bool:
    """Whether the library is loaded already (`load` tried and succeeded), without building it."""
    return _library is True


def cpu_flags() -> str:
    """The CPU's name and its own instruction-set flags (lumen.runtime.cpu): what code built with -march=native
    follows from (a cache key)."""
    return f"{cpu.name()} {cpu.arch()} {' '.join(sorted(cpu.machine_flags()))}"


def _load(sources: tuple[Path, ...] = SOURCES) -> bool:
    if cpu.arch() not in ("x86_64", "aarch64"):
        return False
    if not (shutil.which("c++") or shutil.which("g++")) or not shutil.which("ninja"):  # what torch builds with
        print("lumen: no C++ compiler or ninja to build the block kernels (apt-get install g++ ninja-build); "
              "decoding from blocks uses torch's formula (the same arithmetic, slower)", file=sys.stderr)
        return False
    headers = tuple(h for h in (sources[0].with_name(h.name) for h in HEADERS) if h.exists())  # (beside the sources)
    key = hashlib.sha256(b"".join(s.read_bytes() for s in sources + headers) + " ".join(CFLAGS).encode()
                         + torch.__version__.encode() + cpu_flags().encode()).hexdigest()[:16]
    lib = cache_dir() / "kernels" / f"lumen_quant-{key}.so"
    try:
        if not lib.exists():
            # (imported only to build: it brings setuptools, and a machine builds once)
            from torch.utils import cpp_extension

            print("lumen: building the speed wing's kernels (lumen/fast/quant.cpp, attend.cpp; once per machine)",
                  file=sys.stderr)
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as build, atomic_path(lib) as out:
                cpp_extension.load("lumen_quant", [str(s) for s in sources], extra_cflags=CFLAGS,
                                   extra_ldflags=["-fopenmp"], build_directory=build,
                                   is_python_module=False)  # (and loads it)
                built = next(Path(build).glob("lumen_quant*.so"))  # (torch may add _v1 ...)
                shutil.copyfile(built, out)
                _global(built)
        else:
            torch.ops.load_library(str(lib))
            _global(lib)
    except Exception as e:  # no kernels is slower, not wrong: say why once and go on with torch's formula
        lines = str(e).strip().splitlines() or [type(e).__name__]
        why = next((line for line in lines if "error:" in line), lines[-1]).strip()[:200]  # the compiler's
        print(f"lumen: the block kernels did not build ({why}); decoding from blocks uses torch's formula "
              "(the same arithmetic, slower)", file=sys.stderr)
        return False
    return True


def _global(lib: Path) -> None:
    """The loaded library's symbols made visible to libraries loaded after it: an AOTInductor package
    (aot.py) calls its C functions by their names."""
    ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)  # (the library already loaded, promoted)


# the kernels as C functions: an AOTInductor package calls them directly (no boxed call through the dispatcher)
ROW_PRODUCTS = {kind: f"AOTITorchError aoti_torch_cpu_{kind}_row(AtenTensorHandle x, AtenTensorHandle quads, "
                      "AtenTensorHandle* ret0)" for kind in ("q4_1", "q8_0")}
ATTEND_ONE = ("AOTITorchError aoti_torch_cpu_attend_one(AtenTensorHandle q, AtenTensorHandle k, "
              "AtenTensorHandle v, AtenTensorHandle allowed, AtenTensorHandle* ret0)")


def c_shims(products: bool) -> dict:
    """AOTInductor's `custom_ops_to_c_shims`: the block products (where the step has them and the library is
    loaded) and one query's attention (where it is loaded), each op to its C function's signature."""
    shims = {}
    if products and loaded():
        shims = {getattr(torch.ops.lumen, f"{kind}_row").default: [c] for kind, c in ROW_PRODUCTS.items()}
    if loaded():  # (one_query_attention's step calls attend.cpp's kernel then)
        shims[torch.ops.lumen.attend_one.default] = [ATTEND_ONE]
    return shims
