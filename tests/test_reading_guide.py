"""docs/reading-guide.md cannot drift from the code: every row that cites a file and a line range names (in
backticks) a class, function, method or constant that is defined exactly within that range, and its snippet
runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "reading-guide.md"
CODE = ROOT / "code" / "lumen"
ROW = re.compile(r"^\|[^|]*\| `([\w/]+\.py)` \| (\d+)-(\d+) \| (?:\*\*first\*\* )?`([\w.]+)`", re.M)


def definitions(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (first line, last line) of every top-level class, function and assignment, and Class.method."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            found[node.name] = (node.lineno, node.end_lineno)
            if isinstance(node, ast.ClassDef):
                found |= {f"{node.name}.{m.name}": (m.lineno, m.end_lineno) for m in node.body
                          if isinstance(m, ast.FunctionDef)}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    found[t.id] = (node.lineno, node.end_lineno)
    return found


ROWS = ROW.findall(GUIDE.read_text())


def test_the_guide_cites_the_reading_house():
    assert len(ROWS) >= 20 and {f for f, *_ in ROWS} >= {"block.py", "attention.py", "model.py", "decode.py"}


@pytest.mark.parametrize("file, start, end, name", ROWS, ids=[f"{f}:{a}-{b} {n}" for f, a, b, n in ROWS])
def test_every_cited_range_holds_what_it_names(file, start, end, name):
    path = CODE / file
    lines = len(path.read_text().splitlines())
    if name == path.stem:  # the whole module
        assert (int(start), int(end)) == (1, lines), f"{file} has lines 1-{lines}"
        return
    defs = definitions(path)
    assert name in defs, f"{file} defines no {name}"
    first, last = defs[name]
    # the definition lies within the cited lines (a comment just above it may be included), and fills most of them
    assert int(start) <= first and last <= int(end), f"{name} is at {file}:{first}-{last}, the guide says {start}-{end}"
    assert first - int(start) <= 3, f"{name} starts at line {first}, the guide says {start}"


def test_the_guides_snippet_runs():
    code = re.search(r"```python\n(.*?)```", GUIDE.read_text(), re.S).group(1)
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide"})
