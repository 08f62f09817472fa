"""lumen.fast.kernels: the speed wing's C++ library is built from files an installed lumen holds, and only
kernels.py builds it, loads it or names its ops."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lumen.fast import kernels
from lumen.files import read_toml

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_ships_every_file_the_kernels_are_built_from():
    """An installed lumen builds the library on the user's machine: the package data holds its sources and
    every header they include (read from the sources), else wherever lumen is installed rather than checked
    out it would fall back to torch's slower formula."""
    included = {name for s in kernels.SOURCES for name in re.findall(r'#include "([^"]+)"', s.read_text())}
    assert included and included <= {h.name for h in kernels.HEADERS}
    shipped = read_toml(ROOT / "pyproject.toml", "pyproject.toml")["tool"]["setuptools"]["package-data"]["lumen.fast"]
    assert {p.name for p in (*kernels.SOURCES, *kernels.HEADERS)} <= set(shipped)


def _dotted(node: ast.AST) -> str:
    """An attribute chain's dotted name (torch.ops.lumen.attend_one), or '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def test_only_kernels_py_builds_loads_or_names_an_op_of_lumen():
    """lumen's code (not its strings: docstrings may name the ops) reaches torch's C++ extension builder, its
    library loader, its op registry and the `lumen::` ops only in fast/kernels.py; every other module calls
    kernels.py's functions. The check itself sees kernels.py do all four."""
    reaching = ("torch.utils.cpp_extension", "torch.ops.load_library", "torch.library", "torch.ops.lumen")
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "code" / "lumen").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {_dotted(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                  for a in n.names}
        hits = {r for r in reaching if any(name == r or name.startswith(r + ".") for name in names)}
        if hits:
            found[path.relative_to(ROOT / "code" / "lumen").as_posix()] = hits
    assert found == {"fast/kernels.py": set(reaching)}
