"""Where lumen's own solution lives: a dotted name -> its file, first and last line, and its source, found
by `inspect` (classes, functions, methods) or by reading the module's syntax tree (a module-level name,
such as config.ACTIVATIONS), never by a line number written down.

    >>> loc = where("lumen.block.LayerNorm")
    >>> loc.file.name, loc.source().splitlines()[0]
    ('block.py', 'class LayerNorm(nn.Module):')
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError


@dataclass(frozen=True)
class Location:
    name: str      # the dotted name asked for
    file: Path
    first: int     # 1-based, inclusive
    last: int

    def source(self) -> str:
        return "\n".join(self.file.read_text().splitlines()[self.first - 1 : self.last])

    def __str__(self) -> str:
        return f"{self.file}:{self.first}-{self.last}"


def where(dotted: str) -> Location:
    """The file and lines of `dotted` (module.Class, module.Class.method, module.function, module.NAME)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):   # the longest prefix that is a module
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        obj: object = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        file = Path(inspect.getsourcefile(module) or "")
        if callable(obj):
            obj = inspect.unwrap(obj)   # a decorated function (torch.no_grad) is the function it wraps
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj):
            lines, first = inspect.getsourcelines(obj)
            return Location(dotted, Path(inspect.getsourcefile(obj) or file), first, first + len(lines) - 1)
        if isinstance(obj, property) and obj.fget is not None:
            lines, first = inspect.getsourcelines(obj.fget)
            return Location(dotted, file, first, first + len(lines) - 1)
        return _assignment(dotted, file, parts[-1])
    raise UserError(f"{dotted}: not a name in lumen")


def _assignment(dotted: str, file: Path, name: str) -> Location:
    """A module-level `NAME = ...` or `NAME: T = ...`, read from the module's syntax tree."""
    for node in ast.parse(file.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return Location(dotted, file, node.lineno, node.end_lineno or node.lineno)
    raise UserError(f"{dotted}: no assignment of {name} in {file}")
