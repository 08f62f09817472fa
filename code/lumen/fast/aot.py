"""A decoding step compiled ahead of time (AOTInductor): one token through the model and its KV cache, as a
C++ library built once and loaded from disk, with no Python between its kernels.

torch.compile's step (`decoding(model, compile=True)`) is a graph called from Python: every token, dynamo
checks its guards and the graph's Python wrapper calls each kernel. Here the same step is exported once
(torch.export: the model's forward for one token, the cache's keys, values and length as inputs it writes in
place) and compiled by AOTInductor into a package under the lumen cache. A later process only loads it: no
tracing, no compiler in memory. The package holds code, not weights: it reads the model's own tensors
(`load_constants`, user-managed), so it is keyed by the model's shape, not its values: two checkpoints of
one architecture share it.

    >>> with decoding(model, compile="aot") as decoder:        # doctest: +SKIP
    ...     ids = decoder.generate(idx, 64, temperature=0)

The tokens are lumen.decode's (the same loop, the same `Sampling`); a step's numbers are torch.compile's
kernels' to float32 rounding. A GGUF's block products stay the custom op they are (quant.cpp's
`lumen::q4_1_row`, `lumen::q8_0_row`), called from the package.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn as nn

from ..attention import KVCache, LayerCache
from ..files import atomic_path
from ..model import GPT
from ..runtime.cache import cache_dir
from ..runtime.compiling import check_cpp_compiler
from . import kernels
from .options import DECODE_OPTIONS
from .quant import QuantMatrix


class OneTokenStep(nn.Module):
    """The model's forward for one token per row with a KV cache, written with tensors only (what
    torch.export takes): logits (B, 1, vocab); keys[i], values[i] (B, h_kv, slots, hd) get the token's key
    and value at slot `length`, and length (a 0-dim tensor) grows by one, in place."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model
        # a cache as KVCache's constructor makes one (on the meta device: no memory, and built outside the
        # exported graph), whose tensors each call replaces with the step's inputs
        self.cache = KVCache(model.cfg, 1, 1, device="meta")

    def forward(self, idx: torch.Tensor, length: torch.Tensor, keys: list[torch.Tensor],
                values: list[torch.Tensor]) -> torch.Tensor:
        self.cache.length = length
        self.cache.layers = [LayerCache(k, v, length) for k, v in zip(keys, values)]
        logits, _ = self.model(idx, cache=self.cache)
        return logits


def step_sources(model: GPT) -> list[Path]:
    """The source files a step's code follows from, found rather than listed: the module of every class the
    step is made of (its bases included), every lumen module those import at module level, followed to the
    end, and the C++ sources of the kernels it calls. Moving code into a new file moves it into the key."""
    names = {c.__module__ for m in OneTokenStep(model).modules() for c in type(m).__mro__}
    todo, seen = sorted(n for n in names if n.split(".")[0] == "lumen"), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(_lumen_imports(name) - seen)
    files = [Path(file) for name in seen if (file := getattr(importlib.import_module(name), "__file__", None))]
    return sorted(files) + [*kernels.SOURCES, *kernels.HEADERS]


def _lumen_imports(name: str) -> set[str]:
    """The lumen modules that module `name` imports at module level (not inside its functions: what its code
    can reach when it runs)."""
    module = importlib.import_module(name)
    package = module.__package__ or ""
    tree = ast.parse(Path(module.__file__ or "").read_text())
    found: set[str] = set()
    for node in _module_level(tree.body):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module or ""
            for alias in node.names:  # `from . import kernels` names a module; `from .quads import pack`, its module
                found.add(f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base)
    return {n for n in found if n.split(".")[0] == "lumen" and _is_module(n)}


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run when a module is imported: its body, into if/try/with blocks, not into functions
    or classes."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            yield from _module_level(node.body)
            yield from _module_level(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                yield from _module_level(handler.body)
            yield from _module_level(getattr(node, "finalbody", []))


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def options(model: GPT) -> dict:
    """AOTInductor's settings: the door's compile options; the weights left out of the package (the step
    reads the model's own); each kernel a profiler event or not, as inductor is set (bench/profile_decode.py).

    One package serves every thread count the thread tuner tries. Where every product is quant.cpp's (a
    GGUF's blocks), those split their rows among the threads torch has when the step runs, and inductor's own
    loops (norms, rotations, the cache's writes: a few hundred numbers each) run on one thread: splitting them
    would make each a parallel region ending at a barrier, ~300 a token. Where inductor writes the products
    (float weights), its loops read the thread count when the step runs (`cpp.dynamic_threads`)."""
    # (inductor's settings as this process has them; a process that only loads packages never imports it)
    config = sys.modules.get("torch._inductor.config")
    blocks = any(isinstance(m, QuantMatrix) for m in model.modules()) and kernels.load()
    small_loops_only = blocks and not any(isinstance(m, nn.Linear) for m in model.modules())
    threads = {"cpp.min_chunk_size": 2**40} if small_loops_only else {"cpp.dynamic_threads": True}
    profiled = bool(config and config.cpp.enable_kernel_profile)
    return {**DECODE_OPTIONS, **threads, "aot_inductor.package_constants_in_so": False,
            "aot_inductor.custom_ops_to_c_shims": kernels.c_shims(products=blocks),
            "cpp.enable_kernel_profile": profiled}


def package_path(model: GPT, batch: int, slots: int) -> Path:
    """Where the step of this model's shape, batch and cache size is kept: keyed by everything its code
    follows from (the modules and their tensors' shapes, the sources of their code: `step_sources`, torch's
    version, the CPU and the instructions torch writes code for: ATEN_CPU_CAPABILITY may hold them below it)."""
    h = hashlib.sha256()
    for path in step_sources(model):
        h.update(path.read_bytes())
    tensors = [(n, tuple(t.shape), str(t.dtype)) for n, t in _tensors(OneTokenStep(model)).items()]
    for part in (repr(model), repr(model.cfg), repr(tensors), f"{batch} {slots}", torch.__version__,
                 kernels.cpu_flags(), torch.backends.cpu.get_cpu_capability(), repr(sorted(options(model).items()))):
        h.update(part.encode())
    return cache_dir() / "steps" / f"step-{h.hexdigest()[:16]}.pt2"


def _tensors(step: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by its full name, a tied or shared one under each of its names (the
    package asks for constants by those names)."""
    named = [*step.named_parameters(remove_duplicate=False), *step.named_buffers(remove_duplicate=False)]
    return {n: t.detach() for n, t in named if t is not None}


def _example(model: GPT, batch: int, slots: int) -> tuple:
    cache = KVCache(model.cfg, batch, slots, model.device, model.dtype)
    return (torch.zeros(batch, 1, dtype=torch.long, device=model.device), cache.length,
            [layer.k for layer in cache.layers], [layer.v for layer in cache.layers])


def build(model: GPT, batch: int, slots: int, path: Path) -> None:
    """Export the one-token step and compile it into a package at path (minutes on two cores)."""
    from torch._inductor import aoti_compile_and_package

    check_cpp_compiler("decode without compile='aot'")

    print(f"lumen: compiling the decoding step ahead of time (once for this model's shape; {path.parent})",
          file=sys.stderr)
    with torch.no_grad():
        program = torch.export.export(OneTokenStep(model), _example(model, batch, slots), strict=False)
    with tempfile.TemporaryDirectory() as tmp, atomic_path(path) as out:
        built = aoti_compile_and_package(program, package_path=str(Path(tmp) / "step.pt2"),
                                         inductor_configs=options(model))
        shutil.copyfile(built, out)


class AOTStep:
    """A decoding step as lumen.decode.tokens calls it, `step(idx, cache=cache)`: a one-token step with a
    cache runs the package of its batch and cache size (built the first time, then only loaded); anything
    else (a prompt, a padded batch, a re-read window) runs the model as it is."""

    def __init__(self, model: GPT):
        self.model = model
        self.weights = _tensors(OneTokenStep(model))  # held here: the packages keep pointers to them
        self.packages: dict[tuple[int, int], torch._C._aoti.AOTIModelPackageLoader] = {}

    def package(self, batch: int, slots: int) -> torch._C._aoti.AOTIModelPackageLoader:
        """The loaded step for this batch and cache size, built first if no process built it before."""
        if (batch, slots) not in self.packages:
            path = package_path(self.model, batch, slots)
            if not path.exists():
                build(self.model, batch, slots, path)
            # (the loader itself, not torch._inductor's wrapper around it: a decoding process that only
            # loads the package never imports the compiler)
            loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
            wanted = loader.get_constant_fqns()
            # (constants, not a buffer of the run; every one given; user-managed: the model's tensors, no copy)
            loader.load_constants({n: self.weights[n] for n in wanted}, False, True, True, False)
            self.packages[batch, slots] = loader
        return self.packages[batch, slots]

    def __call__(self, idx: torch.Tensor, cache: KVCache | None = None,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if cache is None or mask is not None or cache.padding is not None or idx.size(1) != 1:
            return self.model(idx, cache=cache, mask=mask)
        cache.check_room(1)
        step = self.package(idx.size(0), cache.slots)
        inputs = [idx, cache.length, *(layer.k for layer in cache.layers), *(layer.v for layer in cache.layers)]
        (logits,) = step.boxed_run(inputs)
        return logits, None
