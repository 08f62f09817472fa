"""What an experiment hands back, and how it is written: a markdown table, a JSON file of the numbers,
PNG figures.

    >>> r = Result("init-scaling", claim="...", tables=[Table("", ["blocks", "variance"], [[48, 1.0]])])
    >>> print(r.markdown())
    ## init-scaling
    <BLANKLINE>
    *Claim:* ...
    <BLANKLINE>
    | blocks | variance |
    |---|---|
    | 48 | 1 |
    <BLANKLINE>
    <sub>full size, seed 0, 0 s</sub>
    <BLANKLINE>
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..errors import MissingFileError, UserError
from ..files import atomic_path, read_json, write_text


@dataclass
class Table:
    """One markdown table: a title, column names, rows of cells (numbers are formatted for reading)."""

    title: str
    columns: list[str]
    rows: list[list]

    def markdown(self) -> str:
        lines = [f"**{self.title}**", ""] if self.title else []
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines)


@dataclass
class Result:
    """An experiment's outcome: the claim it tests, its tables, what the numbers say (`verdict`), every
    number for JSON, and matplotlib figures by file stem. `seconds` is wall time (not part of the numbers,
    which are deterministic for a seed), `machine` the line naming where it ran (lumen.runtime.cpu.machine)."""

    name: str
    claim: str
    tables: list[Table]
    verdict: str = ""
    numbers: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)   # stem -> matplotlib Figure
    notes: list[str] = field(default_factory=list)
    quick: bool = False
    seed: int = 0
    seconds: float = 0.0
    machine: str = ""

    def markdown(self, figure_dir: str | None = None) -> str:
        """The result as a markdown section; figures are linked from figure_dir (relative) if given."""
        size = "quick size" if self.quick else "full size"
        out = [f"## {self.name}", "", f"*Claim:* {self.claim}", ""]
        for t in self.tables:
            out += [t.markdown(), ""]
        if self.verdict:
            out += [f"*What it shows:* {self.verdict}", ""]
        out += [f"- {n}" for n in self.notes]
        if self.notes:
            out.append("")
        if figure_dir is not None:
            out += [f"![{self.name}: {stem}]({figure_dir}/{stem}.png)" for stem in self.figures]
            out.append("")
        on = f" on {self.machine}" if self.machine else ""
        out.append(f"<sub>{size}, seed {self.seed}, {self.seconds:.0f} s{on}</sub>")
        return "\n".join(out) + "\n"

    def to_json(self) -> dict:
        return {"name": self.name, "claim": self.claim, "quick": self.quick, "seed": self.seed,
                "verdict": self.verdict, "numbers": self.numbers, "notes": self.notes,
                "tables": [{"title": t.title, "columns": t.columns, "rows": t.rows} for t in self.tables],
                "figures": list(self.figures), "seconds": round(self.seconds, 2), "machine": self.machine}

    @classmethod
    def load(cls, folder: str | Path) -> Result:
        """A result as written by `write` (its figures stay on disk: `figures` maps stems to None)."""
        path = Path(folder) / "numbers.json"
        if not path.is_file():
            raise MissingFileError(f"no experiment result at {path} (run `lumen experiment NAME --out ...` first)")
        d = read_json(path, "experiment result", UserError, f"write it again with `lumen experiment` --out {folder}")
        return cls(d["name"], d["claim"], [Table(t["title"], t["columns"], t["rows"]) for t in d["tables"]],
                   d["verdict"], d["numbers"], dict.fromkeys(d.get("figures", [])), d["notes"], d["quick"],
                   d["seed"], d["seconds"], d.get("machine", ""))

    def write(self, folder: str | Path) -> list[Path]:
        """table.md, numbers.json and one PNG per figure into folder/; returns the paths written."""
        folder = Path(folder)
        paths = [write_text(folder / "table.md", self.markdown(figure_dir=".")),
                 write_text(folder / "numbers.json", json.dumps(self.to_json(), indent=1, default=_plain) + "\n")]
        for stem, fig in self.figures.items():
            if fig is None:   # a loaded result: its figure is already on disk
                continue
            with atomic_path(folder / f"{stem}.png") as tmp:
                fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
            paths.append(folder / f"{stem}.png")
        return paths


def fmt(x: object) -> str:
    """A table cell: floats to 3-4 significant digits, large counts with separators."""
    if isinstance(x, bool) or x is None:
        return "" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10_000 else str(x)
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
            return f"{x:.3g}"
        return f"{x:.4g}" if abs(x) < 100 else f"{x:,.1f}"
    return str(x)


def _plain(x: object) -> object:
    """JSON for numpy / torch scalars."""
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


def figure(ncols: int = 1, width: float = 6.0, height: float = 4.0):
    """A matplotlib (figure, axes) pair drawn off-screen on Agg's canvas (no pyplot state, no display)."""
    fig = Figure(figsize=(width * ncols, height), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)
    return fig, list(axes[0])
