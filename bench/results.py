"""What a bench measured, as data: one JSON file per bench under docs/speed/, from which bench/speed_doc.py
renders docs/speed.md. Each file names the machine (CPU model and the flags that decide the kernels: AMX,
AVX-512 VNNI and BF16, AVX2), torch's version, the date, the load average before and after the bench, the
command, and the bench's own tables.

    >>> with Record("llamacpp") as rec:                # doctest: +SKIP
    ...     rec["decode"] = [...]                      # anything JSON can hold
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "speed"


def machine() -> dict[str, Any]:
    """The CPU's model, core count and kernel-deciding flags; Python's and torch's versions."""
    import torch

    from lumen import cpu

    return {"cpu": cpu.name(), "arch": cpu.arch(), "cores": os.cpu_count(), "flags": cpu.kernel_flags(),
            "amx": cpu.has("amx_tile"),
            "python": platform.python_version(), "torch": torch.__version__}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Record(dict):
    """A bench's results, written to docs/speed/NAME.json on leaving (with the load average then)."""

    def __init__(self, name: str, out: Path | None = None):
        super().__init__(bench=name, command=" ".join([f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
                         machine=machine(), date=datetime.date.today().isoformat(), load_before=load_average())
        self.path = (out or RESULTS) / f"{name}.json"

    def __enter__(self) -> Record:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None:  # a bench that failed writes nothing: the page keeps its last good result
            return
        self["load_after"] = load_average()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self, indent=1) + "\n")
        print(f"wrote {self.path}", file=sys.stderr)


def read(name: str, where: Path | None = None) -> dict[str, Any] | None:
    """A bench's last results, or None if it never ran here."""
    path = (where or RESULTS) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None
