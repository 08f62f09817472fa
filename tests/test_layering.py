"""docs/architecture.md's import rules, checked against the code: every `import` and `from ... import` in
code/lumen (module level or inside a function) is read with `ast`, and the graph between lumen's top-level
modules and packages is held to the layers the page describes."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "code" / "lumen"

# the reading house (the chapter's model and what a GPT needs to exist, decode, be named, counted and fail
# clearly) and the utilities every room shares: errors, atomic files, the progress bar
CORE = {"config", "block", "attention", "model", "decode", "names", "accounting", "errors", "files", "progress"}
# the machine lumen runs on (the CPU's flags, the thread count, the heap's settings, torch.compile's options, the
# cache folder): below the speed wing and the training loop, and the reading house never imports it
RUNTIME = "runtime"
# the speed wing: nothing but the command line imports it (bench/ does too, from outside the package)
WING = "fast"
# what may be imported by each layer above the core (the core itself is open to everyone)
ALLOWED = {
    RUNTIME: set(),
    "tokenizers": set(),
    "fetch": {RUNTIME},   # the cache folder
    "evaluate": set(),
    "prompts": {"tokenizers"},
    "formats": {"tokenizers", "fetch"},
    "data": {"tokenizers", "fetch", "formats", RUNTIME},   # the cache folder
    WING: {"tokenizers", "fetch", "formats", RUNTIME},
    "report": {"inspect", "tokenizers"},
    "train": {"tokenizers", "data", "formats", RUNTIME},
    "inspect": {"tokenizers", "data", "evaluate", "formats", "prompts"},
    "practice": {"tokenizers", "data", "evaluate", "formats", "fetch", "inspect"},
    "features": {"tokenizers", "data", "formats", "inspect", "prompts", "train"},   # train: the one training loop
    "experiments": {"tokenizers", "data", "formats", "fetch", "evaluate", "train", "inspect", "report", "prompts",
                    "features", RUNTIME},
    "cli": {"tokenizers", "data", "formats", "fetch", "evaluate", "train", "inspect", "report", "experiments",
            WING, "practice", "prompts", "features", RUNTIME},
    "__main__": {"cli"},
}


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _lumen_imports(source: str, package: list[str]) -> set[str]:
    """The lumen top-level modules and packages that the imports in source (a module of `package`) name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb level - 1 packages from this module's package
                base = package[: len(package) - node.level + 1]
                target = base + (node.module.split(".") if node.module else [])
                names = [target + [a.name] for a in node.names] if len(target) == 1 else [target]
            else:
                names = [(node.module or "").split(".")]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
        else:
            continue
        # (a name that is not a module, e.g. `from .. import __version__`, is an attribute of the package)
        found |= {n[1] for n in names if n[0] == "lumen" and len(n) > 1 and _is_module(n[1])}
    return found


def _is_module(name: str) -> bool:
    return (ROOT / f"{name}.py").is_file() or (ROOT / name / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        here = _module(path)
        if len(here) < 2:  # lumen/__init__.py re-exports the core
            continue
        package = here if path.name == "__init__.py" else here[:-1]
        graph[here[1]] |= _lumen_imports(path.read_text(), package) - {here[1]}
    return graph


def test_the_import_reader_sees_every_form_of_import():
    source = """
import torch
import lumen.fetch
from lumen.data import prepare
from .. import tokenizers
from ..model import GPT
from . import checkpoint

def f():
    from ..inspect.lens import logit_lens
"""
    assert _lumen_imports(source, ["lumen", "formats"]) == {"fetch", "data", "tokenizers", "model", "formats",
                                                            "inspect"}
    assert _lumen_imports("from .errors import UserError", ["lumen"]) == {"errors"}
    assert {"attention", "block", "config", "errors"} <= import_graph()["model"]


# the one documented exception: GPT.run_with_cache (TransformerLens's entry point) imports lumen.inspect when
# called, inside the method; importing the core still loads nothing above it (tests/test_model.py checks that)
CALLED_NOT_IMPORTED = {"model": {"inspect"}}


def test_the_core_imports_only_the_core():
    graph = import_graph()
    for name in CORE:
        extra = graph[name] - CORE - CALLED_NOT_IMPORTED.get(name, set())
        assert not extra, f"lumen.{name} imports {sorted(extra)}"


def test_every_layer_imports_only_what_the_architecture_page_allows():
    graph = import_graph()
    assert set(graph) <= CORE | set(ALLOWED), sorted(set(graph) - CORE - set(ALLOWED))
    for name, allowed in ALLOWED.items():
        extra = graph[name] - CORE - allowed
        assert not extra, f"lumen.{name} imports {sorted(extra)}: not in docs/architecture.md's rules"


def test_nothing_imports_the_cli_or_the_experiments_from_below():
    graph = import_graph()
    assert [n for n, deps in graph.items() if "cli" in deps] == ["__main__"]
    assert sorted(n for n, deps in graph.items() if "experiments" in deps) == ["cli"]


def test_the_speed_wing_has_one_door_and_the_reading_house_never_opens_it():
    """Loading, eval, the lenses, attribution, patching, training and the reports import nothing of lumen.fast:
    only the command line does (its generate command; bench/ from outside)."""
    graph = import_graph()
    assert sorted(n for n, deps in graph.items() if WING in deps) == ["cli"]
    assert ALLOWED[WING] & {"inspect", "train", "report", "experiments", "cli"} == set()


def test_no_test_imports_another_test_file():
    """Shared builders live in tests/helpers/ (or fixtures): a test file is never a library of another."""
    tests = Path(__file__).parent
    names = {p.stem for p in tests.glob("test_*.py")}
    offenders = []
    for path in sorted(tests.glob("test_*.py")) + sorted((tests / "helpers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name} imports {m}" for m in modules if m.split(".")[0] in names]
    assert not offenders, "; ".join(offenders)


# The one documented circle: GPT's methods (generate, run_with_cache: the chapter's and TransformerLens's entry
# points) import lumen.decode and lumen.inspect when called; both import lumen.model
CALLED_FROM_A_METHOD = {("lumen.model", "lumen.decode"), ("lumen.model", "lumen.inspect.cache")}


def _is_module_path(parts: list[str]) -> bool:
    path = ROOT.parent.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_imports(source: str, package: list[str]) -> set[str]:
    """The lumen modules (dotted, as deep as they go: lumen.fast.aot) that the imports in source name, at
    module level or inside a function, a TYPE_CHECKING block included."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            for alias in node.names:  # `from . import quant` names a module; `from .quant import pack` its module
                found.add(".".join(target + [alias.name] if _is_module_path(target + [alias.name]) else target))
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {name for name in found if name.startswith("lumen.") and _is_module_path(name.split("."))}


def module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        here = _module(path)
        package = here if path.name == "__init__.py" else here[:-1]
        graph[".".join(here)] = _module_imports(path.read_text(), package) - {".".join(here)}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of graph with more than one module (Tarjan's algorithm): each a set of
    modules that import one another, directly or through others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_circle_finder_finds_a_circle_through_three_modules_and_none_in_a_line():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert _module_imports("from .options import X\nfrom . import aot\ndef f():\n    from ..train import machine",
                           ["lumen", "fast"]) == {"lumen.fast.options", "lumen.fast.aot", "lumen.train.machine"}


def test_no_module_of_lumen_imports_itself_through_others():
    """No import circles inside lumen, module by module (fast.aot <-> fast.decoding, fast.attention <->
    fast.quant and train.config <-> train.machine were the last): a module's imports never lead back to it,
    save the one documented circle (GPT's methods)."""
    graph = module_graph()
    assert {"lumen.fast.aot", "lumen.train.machine"} <= graph["lumen.fast.decoding"] | graph["lumen.train.config"]
    for a, b in CALLED_FROM_A_METHOD:
        assert b in graph[a], f"{a} no longer imports {b}: drop it from CALLED_FROM_A_METHOD"
        graph[a] = graph[a] - {b}
    assert import_circles(graph) == []
