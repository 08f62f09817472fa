"""Decoding from a GGUF file's own quantized weights: the blocks exactly as stored, no re-quantization.

llama.cpp stores a weight row in blocks of 32 numbers. A Q8_0 block is a scale d (float16) and 32
signed 8-bit codes q: w = d q. A Q4_1 block is a scale d, a minimum m (float16) and 32 4-bit codes
q in 0..15 (two to a byte): w = d q + m. A decoded token reads every weight once: ~0.63 bytes per
weight here (the file's packed codes and its float16 scales and minima) against 4 for float32.

One row x (a decoded token) is multiplied as llama.cpp multiplies it: x is rounded to 8 bits per block
of 32 (xq = round(x / dx), dx = max|x| / 127), so that a block's products are integers, summed exactly
and scaled once (the minimum multiplies the exact float sum of x):

    y_o = sum over blocks b of  d_ob dx_b (sum_j q_obj xq_bj)  +  m_ob (sum_j x_bj)

A token's products read the weights once, from memory: the bytes, not the arithmetic, set their pace. So the
blocks are kept in quads (`pack`): the file's bytes reordered into one run, four rows and four blocks
at a time, each group's codes followed by its scales and minima, which one pass of x serves four rows at a
time. `quant.cpp` computes this with the CPU's byte dot-product instructions (built once per machine, under
the lumen cache); `rounded_row_product` is the same formula in torch, its reference and its stand-in where it
does not build. Many rows (a prompt, an evaluation, a lens) multiply the dequantized weights, a slab of rows
at a time: those logits are the dequantized float32 model's (`lumen.formats.load`) to float32 rounding.

    >>> loaded = load_quantized("smollm2")                          # doctest: +SKIP
    >>> lumen.fast.generate(loaded.model, ids, 64, temperature=0, compile=True)   # doctest: +SKIP
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
import torch.nn as nn
import torch.nn.functional as F

from ..fetch import cache_dir
from ..files import atomic_path
from ..formats import Loaded, build, read
from ..runtime import cpu
from ..runtime.heap import hand_back_free_memory
from .changes import Changes

BLOCK = 32  # numbers per block, for both types
SLAB = 4096  # rows dequantized at a time for a product of many rows
ROWS, GROUP = 4, 4  # the quads layout (quant.cpp, `pack`): four rows side by side, four blocks at a time

# x @ w.T for one float32 row x (in,) and a matrix in quads: (4 * quads,), the rows past the matrix's zeros;
# their CPU kernels are quant.cpp's
for _kind in ("q4_1", "q8_0"):
    torch.library.define(f"lumen::{_kind}_row", "(Tensor x, Tensor quads) -> Tensor")

    @torch.library.register_fake(f"lumen::{_kind}_row")
    def _(x: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
        return x.new_empty(ROWS * quads.shape[0])


# one query (B, h, 1, hd) against a cache's keys and values (B, h_kv, S, hd), over the slots allowed (1, S):
# attention.py's OneQueryAttention calls it; its CPU kernel is attend.cpp's, in the same library
torch.library.define("lumen::attend_one", "(Tensor q, Tensor k, Tensor v, Tensor allowed) -> Tensor")


@torch.library.register_fake("lumen::attend_one")
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q)


_kernels: bool | None = None  # quant.cpp: not yet tried, built and loaded, or unavailable here


def kernels() -> bool:
    """Whether quant.cpp's kernels (and attend.cpp's) are loaded: built the first time on this machine (g++ and
    ninja, -march=native: x86-64 with AVX2 and FMA, or ARM64 with NEON; ~30 s) into the lumen cache, keyed by
    the sources, torch's version and the CPU."""
    global _kernels
    if _kernels is None:
        _kernels = _load_kernels()
    return _kernels


# the block products, and one query's attention (attention.py): one library; their arithmetic is the
# headers' (no torch in them: a test also builds them for ARM64 and runs them under emulation)
SOURCES = (Path(__file__).with_name("quant.cpp"), Path(__file__).with_name("attend.cpp"))
HEADERS = (Path(__file__).with_name("quads.h"), Path(__file__).with_name("attend.h"))
# OpenMP too: ATen's parallel_for is written in its headers as an OpenMP loop, so a kernel built without it
# runs every row on one thread whatever torch.set_num_threads says
CFLAGS = ["-O3", "-march=native", "-fopenmp"]


def cpu_flags() -> str:
    """The CPU's name and its own instruction-set flags (lumen.runtime.cpu): what code built with -march=native
    follows from (a cache key)."""
    return f"{cpu.name()} {cpu.arch()} {' '.join(sorted(cpu.machine_flags()))}"


def _load_kernels(sources: tuple[Path, ...] = SOURCES) -> bool:
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
            from torch.utils.cpp_extension import load

            print("lumen: building the speed wing's kernels (lumen/fast/quant.cpp, attend.cpp; once per machine)",
                  file=sys.stderr)
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as build, atomic_path(lib) as out:
                load("lumen_quant", [str(s) for s in sources], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
                     build_directory=build, is_python_module=False)  # (and loads it)
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


def loaded() -> bool:
    """Whether the kernels are loaded already (`kernels` tried and succeeded), without building them."""
    return _kernels is True


def _global(lib: Path) -> None:
    """The loaded kernels' symbols made visible to libraries loaded after them: an AOTInductor package
    (aot.py) calls quant.cpp's C function by its name."""
    ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)  # (the library already loaded, promoted)


@torch.library.custom_op("lumen::stored", mutates_args=())
def stored(x: torch.Tensor) -> torch.Tensor:
    """x, written out to memory. A product of one row reads each input number once per output row, and
    torch.compile folds a cheap producer into the loop that reads it: the final norm before the
    unembedding would be computed again for each of its 49,152 rows (a third of a token's time).
    `rounded_row_product` goes through this op, which the compiler cannot look into."""
    return x.clone()


@stored.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def quads_shape(scale: torch.Tensor, minimum: torch.Tensor | None) -> tuple[int, int]:
    """The shape of a matrix's quads, from its scales (out, in / 32) and whether it has minima (Q4_1: 20 bytes a
    block; Q8_0: 34): (quads, bytes of four rows)."""
    out, nb = scale.shape
    return -(-out // ROWS), ROWS * nb * (34 if minimum is None else 20)


def pack(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None,
         into: torch.Tensor | None = None) -> torch.Tensor:
    """A matrix's blocks (as `formats.gguf.stored_quantized` reads them) in quads, the layout quant.cpp reads front
    to back: (ceil(out / 4), bytes of four rows) uint8. A quad's bytes are its groups of four blocks (a row's last
    group: its last 1-3), each group the four rows' codes one row after another, then the group's scales and,
    for Q4_1, its minima, block by block, the four rows' of a block together (float16). Rows past the matrix
    (out not a multiple of 4) are zeros. The same bytes, in another order: `unpack` gives them back. into: a
    buffer of `quads_shape` to write them to (else a new one)."""
    out, nb = scale.shape
    into = torch.empty(quads_shape(scale, minimum), dtype=torch.uint8, device=codes.device) if into is None else into
    for i in range(0, out, SLAB):  # (a slab of rows at a time: a large matrix is never copied whole)
        rows = slice(i, i + SLAB)  # (SLAB: a multiple of ROWS)
        quads, pad = -(-min(SLAB, out - i) // ROWS), -min(SLAB, out - i) % ROWS
        code = F.pad(codes[rows].view(torch.uint8), (0, 0, 0, pad)).view(quads, ROWS, nb, -1)
        floats = [F.pad(t[rows], (0, 0, 0, pad)).view(quads, ROWS, nb) for t in (scale, minimum) if t is not None]
        parts = []
        for b in range(0, nb, GROUP):
            g = slice(b, b + GROUP)
            parts.append(code[:, :, g].reshape(quads, -1))  # row by row
            # block by block, a block's four rows together
            parts += [t[:, :, g].transpose(1, 2).contiguous().view(quads, -1).view(torch.uint8) for t in floats]
        torch.cat(parts, 1, out=into[i // ROWS: i // ROWS + quads])
    return into


def unpack(quads: torch.Tensor, nb: int, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`pack` undone: the quads' rows (4 a quad) as the file holds them: (codes, scale, minimum)."""
    n, per = quads.shape[0], 16 if kind == "Q4_1" else 32  # code bytes per block
    codes: list[torch.Tensor] = []
    floats: list[list[torch.Tensor]] = [[], []] if kind == "Q4_1" else [[]]
    at = 0
    for b in range(0, nb, GROUP):
        k = min(GROUP, nb - b)
        codes.append(quads[:, at: at + ROWS * k * per].reshape(n, ROWS, k * per))
        at += ROWS * k * per
        for part in floats:
            half = quads[:, at: at + 2 * ROWS * k].contiguous().view(torch.float16)
            part.append(half.reshape(n, k, ROWS).transpose(1, 2))
            at += 2 * ROWS * k
    code = torch.cat(codes, 2).reshape(n * ROWS, nb * per)
    scale, *minimum = (torch.cat(part, 2).reshape(n * ROWS, nb) for part in floats)
    return code if kind == "Q4_1" else code.view(torch.int8), scale, minimum[0] if minimum else None


class QuantMatrix(nn.Module):
    """A (out, in) matrix as the file's blocks: per block of 32 numbers of a row, its codes (Q8_0: int8, one a
    number; Q4_1: 0..15, two a byte, a block's numbers 0-15 in the low halves of its 16 bytes and 16-31 in the
    high halves), its scale and, for Q4_1, its minimum (the file's float16). Kept in quads (`pack`): the file's
    bytes in the order a decoded token's product reads them. `file_rows` gives them in the file's layout."""

    quads: torch.Tensor

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None,
                 into: torch.Tensor | None = None):
        super().__init__()
        if scale.dtype != torch.float16 or (minimum is not None and minimum.dtype != torch.float16):
            raise ValueError("a block's scale and minimum are the file's float16 numbers")
        self.out, self.row_blocks, self.kind = scale.shape[0], scale.shape[1], "Q8_0" if minimum is None else "Q4_1"
        self.register_buffer("quads", pack(codes, scale, minimum, into))  # (into: a place in a model's one buffer)
        kernels()  # built (or found wanting) now, at load time, not while torch.compile traces

    @classmethod
    def stack(cls, parts: list[QuantMatrix]) -> QuantMatrix:
        """One matrix of the parts' rows, one part after another (each a multiple of 4 rows): the parts' quads
        become views of its quads (no memory added). Parts that lie one after another in memory already (a
        model's one buffer, `load_quantized`) stay where they are: the stack is a view of them."""
        assert all(p.out % ROWS == 0 and (p.kind, p.row_blocks) == (parts[0].kind, parts[0].row_blocks) for p in parts)
        stacked = cls.__new__(cls)
        nn.Module.__init__(stacked)
        stacked.out, stacked.row_blocks, stacked.kind = sum(p.out for p in parts), parts[0].row_blocks, parts[0].kind
        first, width = parts[0].quads, parts[0].quads.shape[1]
        adjacent = all(a.quads.untyped_storage().data_ptr() == b.quads.untyped_storage().data_ptr()
                       and a.quads.data_ptr() + a.quads.nbytes == b.quads.data_ptr() for a, b in zip(parts, parts[1:]))
        quads = (first.as_strided((stacked.out // ROWS, width), (width, 1)) if adjacent
                 else torch.cat([p.quads for p in parts]))
        stacked.register_buffer("quads", quads)
        start = 0
        for p in parts:
            p.quads = stacked.quads[start: start + p.out // ROWS]
            start += p.out // ROWS
        return stacked

    @property
    def shape(self) -> tuple[int, int]:
        return self.out, self.row_blocks * BLOCK

    def file_rows(self, rows: slice | torch.Tensor = slice(None)) -> tuple[torch.Tensor, torch.Tensor,
                                                                         torch.Tensor | None]:
        """Those rows (a slice, or a tensor of row indices) as the file holds them: (codes, scale, minimum),
        codes (..., in) int8 for Q8_0, (..., in / 2) uint8 for Q4_1, scale and minimum (..., in / 32)."""
        if isinstance(rows, slice) and rows.step in (None, 1):
            start, stop, _ = rows.indices(self.out)
            first = start // ROWS
            parts = unpack(self.quads[first: -(-max(stop, start) // ROWS)], self.row_blocks, self.kind)
            return tuple(t if t is None else t[start - ROWS * first: stop - ROWS * first] for t in parts)  # type: ignore[return-value]
        index = torch.arange(self.out, device=self.quads.device)[rows]
        parts = unpack(self.quads[index.flatten() // ROWS], self.row_blocks, self.kind)
        pick = torch.arange(index.numel(), device=index.device) * ROWS + index.flatten() % ROWS
        return tuple(t if t is None else t[pick].reshape(*index.shape, -1) for t in parts)  # type: ignore[return-value]

    def block_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes as the file holds them (`file_rows`), one to a number: (..., in / 32, 32)."""
        if self.kind == "Q8_0":
            return codes.unflatten(-1, (-1, BLOCK))
        half = codes.unflatten(-1, (-1, BLOCK // 2))  # two codes a byte: a block's low halves, then its high
        return torch.cat([half & 0x0F, half >> 4], -1)

    def dequantized(self, rows: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """The float32 matrix w = d q (+ m), as llama.cpp (and the gguf package) compute it: those rows (a
        slice, or a tensor of row indices: (*idx.shape, in))."""
        codes, scale, minimum = self.file_rows(rows)
        w = self.block_codes(codes).float().mul_(scale[..., None])  # (in place: one buffer of rows)
        if minimum is not None:
            w.add_(minimum[..., None])
        return w.flatten(-2)

    def row_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ w.T for one row x (..., in), x rounded to 8 bits per block (see the module docstring):
        quant.cpp's kernel on CPU where it is built, else `rounded_row_product`."""
        out, n = self.shape
        row = x.reshape(n).float().contiguous()
        if _kernels and row.device.type == "cpu":
            product = torch.ops.lumen.q4_1_row if self.kind == "Q4_1" else torch.ops.lumen.q8_0_row
            y = product(row, self.quads)[:out]
        else:
            y = self.rounded_row_product(row)
        return y.reshape(*x.shape[:-1], out)

    def rounded_row_product(self, x: torch.Tensor) -> torch.Tensor:
        """quant.cpp's formula in torch, for one float32 row x (in,): the same 8-bit x and integer block
        sums (exact in float32: at most 32 x 128 x 127), scaled and summed in another order. A slab of rows
        at a time eagerly; compiled, one fused loop over the codes."""
        out, n = self.shape
        xb = (stored(x) if torch.compiler.is_compiling() else x).reshape(n // BLOCK, BLOCK)
        step = xb.abs().amax(-1) / 127
        xq = torch.round(xb * torch.where(step > 0, 1 / step, 0)[:, None])
        total = xb.sum(-1)  # each block's float sum, for the minima
        slab = out if torch.compiler.is_compiling() else SLAB
        parts = []
        for i in range(0, out, slab):
            codes, scale, minimum = self.file_rows(slice(i, i + slab))
            sums = (self.block_codes(codes).float() * xq).sum(-1)  # (rows, blocks): integers
            y = (sums * (scale * step)).sum(-1)
            if minimum is not None:
                y = y + (minimum * total).sum(-1)
            parts.append(y)
        return torch.cat(parts)

    def extra_repr(self) -> str:
        return f"{self.out} x {self.row_blocks * BLOCK}, {self.kind}"


class QuantLinear(nn.Module):
    """A bias-free linear layer whose weight stays in the file's blocks."""

    def __init__(self, blocks: QuantMatrix):
        super().__init__()
        self.matrix = blocks
        self.out_features, self.in_features = blocks.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1:
            return self.matrix.row_product(x).to(x.dtype)  # a decoded token: 8-bit x, integer products
        # many rows: a slab of rows at a time, so that a 49k-row unembedding never stands whole in float32
        return torch.cat([F.linear(x, self.matrix.dequantized(slice(i, i + SLAB)).to(x.dtype))
                          for i in range(0, self.out_features, SLAB)], -1)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.matrix.kind} blocks of {BLOCK}"


class SharedRow(nn.Module):
    """Matrices that multiply the same row x, their blocks stacked row after row (a layer's q, k and v; an
    MLP's gate and up): a decoded token's products of all of them in one pass of the kernel, x rounded once,
    the threads splitting one long product rather than three short ones. Each matrix's blocks become rows of
    the stack (views: no memory added). `share_rows` turns the layers into SharedQuantLinear ones."""

    def __init__(self, layers: list[QuantLinear]):
        super().__init__()
        self.matrix = QuantMatrix.stack([layer.matrix for layer in layers])
        self.sizes = [layer.out_features for layer in layers]
        self.row: torch.Tensor | None = None  # the row whose products wait to be read, and them
        self.products: list[torch.Tensor] = []

    def product(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """The i-th matrix's product of one row x: the stack's product, computed when the first of them asks
        for it with this x (the same tensor, by identity) and let go when the last has read it."""
        if self.row is not x:
            self.row, self.products = x, list(self.matrix.row_product(x).split(self.sizes, -1))
        y = self.products[i]
        if i == len(self.sizes) - 1:
            self.row, self.products = None, []
        return y

    def extra_repr(self) -> str:
        return f"{' + '.join(map(str, self.sizes))} rows of {self.matrix.shape[1]}, one product"


class SharedQuantLinear(QuantLinear):
    """A QuantLinear that takes a decoded token's product from its SharedRow (its i-th matrix); many rows
    multiply its own blocks as a QuantLinear does."""

    shared: SharedRow
    index: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[:-1].numel() == 1:
            return self.shared.product(x, self.index).to(x.dtype)
        return super().forward(x)


# the layers that multiply one row: a block's attention (q, k, v) and its gated MLP (gate, up)
SAME_ROW = (("q", "k", "v"), ("w_gate", "w_up"))


def share_rows(model: nn.Module, changes: Changes | None = None) -> int:
    """Every group of QuantLinear layers of one module that multiply the same row (SAME_ROW), of one block
    type and width, made one SharedRow; returns how many groups. Recorded in `changes` (undone when they
    end), or until unshare_rows(model)."""
    changes = changes or Changes()
    n = 0
    for parent in list(model.modules()):
        for names in SAME_ROW:
            layers = [getattr(parent, name, None) for name in names]
            if not all(type(layer) is QuantLinear for layer in layers):
                continue
            if len({(layer.matrix.kind, layer.in_features) for layer in layers}) != 1:  # type: ignore[union-attr]
                continue
            if any(layer.out_features % ROWS for layer in layers):  # type: ignore[union-attr]
                continue  # (a stack's parts are whole quads of rows)
            shared = SharedRow(layers)  # type: ignore[arg-type]
            for i, layer in enumerate(layers):
                changes.set_class(layer, SharedQuantLinear)
                changes.set(layer, "shared", shared)
                changes.set(layer, "index", i)
            n += 1
    return n


def unshare_rows(model: nn.Module) -> int:
    """Undo share_rows: plain QuantLinear layers again (their blocks stay rows of one stack: the same numbers);
    returns how many layers."""
    n = 0
    for m in list(model.modules()):
        if type(m) is SharedQuantLinear:
            del m.shared, m.index
            m.__class__ = QuantLinear  # type: ignore[assignment]
            n += 1
    return n


class QuantEmbedding(nn.Module):
    """An embedding table kept in blocks: each looked-up row dequantized on the way out."""

    def __init__(self, blocks: QuantMatrix):
        super().__init__()
        self.matrix = blocks

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.matrix.dequantized(idx)

    def extra_repr(self) -> str:
        out, n = self.matrix.shape
        return f"{out} rows of {n}, {self.matrix.kind} blocks of {BLOCK}"


# ---------------------------------------------------------------------------------------------
# a block's matrices in the order its forward reads them (others after them, by name)
READING = ("attn.q", "attn.k", "attn.v", "attn.out", "mlp.w_gate", "mlp.w_up", "mlp.fc", "mlp.w_down", "mlp.proj")


def reading_order(name: str, tied: bool) -> tuple:
    """Where a matrix comes in a decoded token's reads: the embedding first (a tied one is the unembedding:
    last), then block by block, each block's matrices as its forward reads them, the unembedding last."""
    layer = name.removesuffix(".weight")
    if layer == "tok_emb":
        return (2,) if tied else (0,)
    if layer.startswith("blocks."):
        _, i, rest = layer.split(".", 2)
        return (1, int(i), READING.index(rest) if rest in READING else len(READING), rest)
    return (2, layer)


def load_quantized(spec: str, device: str | torch.device = "cpu") -> Loaded:
    """A GGUF model (smollm2 or a .gguf file) whose Q8_0/Q4_1 matrices stay as the file's blocks: every such
    linear layer a QuantLinear, the embedding a QuantEmbedding (a tied unembedding reads the same blocks),
    the rest (the norms) as lumen.formats reads them. Activations are float32. The matrices' quads lie in one
    buffer in the order a decoded token reads them (`reading_order`): the memory a product asks for ahead of
    its reads runs on into the next matrix's. On a device other than the CPU
    a decoded token's product is torch's formula (`QuantMatrix.rounded_row_product`): quant.cpp is a CPU kernel.

        >>> loaded = load_quantized("smollm2")                         # doctest: +SKIP
        >>> loaded.model.blocks[0].attn.q.blocks                    # doctest: +SKIP
        QuantMatrix(576 x 576, Q4_1)
    """
    w = read(spec, quantized=True)
    parts: dict[str, nn.Module] = {}
    order = sorted(w.quantized, key=lambda name: reading_order(name, w.cfg.tie_embeddings))
    shapes = {name: quads_shape(*w.quantized[name][1:]) for name in order}
    buffer = torch.empty(sum(q * b for q, b in shapes.values()), dtype=torch.uint8)
    at = 0
    for name in order:  # (each matrix's file layout let go once it is in the buffer: no second copy)
        size = shapes[name][0] * shapes[name][1]
        into = buffer[at: at + size].view(shapes[name])
        layer, blocks = name.removesuffix(".weight"), QuantMatrix(*w.quantized.pop(name), into=into)
        parts[layer] = QuantEmbedding(blocks) if layer == "tok_emb" else QuantLinear(blocks)
        at += size
        hand_back_free_memory()  # (the file layout's buffers, freed: else the heap keeps them, ~60 MiB here)
    embedding = parts.get("tok_emb")
    if w.cfg.tie_embeddings and isinstance(embedding, QuantEmbedding):
        parts["lm_head"] = QuantLinear(embedding.matrix)  # the same blocks, read as the unembedding
    return Loaded(build(w, device, parts=parts), w.tokenizer, spec)
