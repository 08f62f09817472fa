"""What a bench measured, as data: one JSON file per bench and kind of machine under docs/speed/, from which
bench/speed_doc.py renders docs/speed.md. Each file names the machine (CPU model, architecture and the flags
that decide the kernels: AMX, AVX-512 VNNI and BF16, AVX-VNNI, AVX2, FMA, ARM's dot product), torch's
version, the date, the load average before and after the bench, the command, and the bench's own tables.

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

    from lumen.runtime import cpu

    return {"cpu": cpu.name(), "arch": cpu.arch(), "cores": os.cpu_count(), "flags": cpu.kernel_flags(),
            "amx": cpu.has("amx_tile"),
            "python": platform.python_version(), "torch": torch.__version__}


# the machine kinds a table is kept for, each its own file (NAME@KIND.json) and its own table on the page
KINDS = {"amx": "AVX-512 with AMX", "avx512": "AVX-512 (no AMX)", "avx2": "AVX2 only (no AVX-512)",
         "arm64": "ARM64", "other": "other"}


def kind(m: dict[str, Any]) -> str:
    """The machine kind a record's `machine` is (KINDS): what decides which kernels ran."""
    flags = set(m.get("flags", []))
    if m.get("arch") == "aarch64":
        return "arm64"
    if m.get("amx") or "amx_tile" in flags:
        return "amx"
    if "avx512f" in flags or "avx512_vnni" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "other"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Record(dict):
    """A bench's results, written to docs/speed/NAME@KIND.json on leaving (with the load average then): one
    file per machine kind (`kind`), so that a bench run on another kind of machine adds a table, not replaces."""

    def __init__(self, name: str, out: Path | None = None):
        super().__init__(bench=name, command=" ".join([f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
                         machine=machine(), date=datetime.date.today().isoformat(), load_before=load_average())
        self.path = (out or RESULTS) / f"{name}@{kind(self['machine'])}.json"

    def __enter__(self) -> Record:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None:  # a bench that failed writes nothing: the page keeps its last good result
            return
        self["load_after"] = load_average()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self, indent=1) + "\n")
        print(f"wrote {self.path}", file=sys.stderr)


def read_all(name: str, where: Path | None = None) -> list[dict[str, Any]]:
    """A bench's last results on each kind of machine (KINDS' order; NAME.json: one from before the kinds)."""
    where = where or RESULTS
    found = {kind(r["machine"]): r for r in (json.loads(p.read_text()) for p in [where / f"{name}.json"]
                                             + sorted(where.glob(f"{name}@*.json")) if p.exists())}
    return [found[k] for k in KINDS if k in found]


def read(name: str, where: Path | None = None) -> dict[str, Any] | None:
    """A bench's last results (on the first kind of machine that has them), or None if it never ran."""
    return next(iter(read_all(name, where)), None)
