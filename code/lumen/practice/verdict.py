"""The last check's verdict, kept in the learner's practice folder, so that `lumen practice hint` answers the
mistake that check saw, one step at a time.

`lumen practice check NAME FILE` writes FILE's folder/.lumen-practice.json: for each exercise checked there,
the file, whether every check passed, the first failure (the check, what it saw, the key of its hint) and
how many steps of that hint have been shown. Plain JSON, read as data: a file that is not what lumen wrote
counts as no verdict (and is written afresh by the next check).

    >>> v = read(Path("."), "layernorm")          # doctest: +SKIP
    >>> v.check, v.hint, v.shown                  # doctest: +SKIP
    ('equal to lumen's LayerNorm on random inputs, shapes, gains and biases', 'unbiased', 1)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import write_text
from .exercise import Report

FILE = ".lumen-practice.json"


@dataclass
class Verdict:
    file: str              # the learner's file, as the check was given it
    passed: bool
    check: str = ""        # the first check that failed
    seen: str = ""         # what it saw
    hint: str | None = None   # the key of the hint that answers it (None: an exception no check recognised)
    shown: int = 0         # the steps of that hint shown so far

    def same_mistake(self, other: Verdict | None) -> bool:
        return other is not None and not self.passed and (self.check, self.hint) == (other.check, other.hint)


def save(report: Report, path: Path) -> Verdict:
    """Keep `report`'s verdict on the file at `path` beside it. The same mistake seen again keeps the steps
    already shown; another mistake starts its hint at step 1."""
    failed = report.failed
    verdict = Verdict(str(path), report.passed)
    if failed:
        first = failed[0]
        verdict.check, verdict.seen, verdict.hint = first.check, first.seen, first.hint
        before = read(path.parent, report.exercise.name)
        if before is not None and verdict.same_mistake(before):
            verdict.shown = before.shown
    _write(path.parent, report.exercise.name, verdict)
    return verdict


def shown(folder: Path, name: str, verdict: Verdict) -> None:
    """Note how many steps of the verdict's hint have been shown."""
    _write(folder, name, verdict)


def read(folder: Path, name: str) -> Verdict | None:
    """The last verdict on exercise `name` kept in `folder`, or None (never checked there, or unreadable)."""
    entry = _all(folder).get(name)
    if not isinstance(entry, dict):
        return None
    try:
        v = Verdict(**{k: entry[k] for k in Verdict.__dataclass_fields__ if k in entry})
    except TypeError:
        return None
    kinds_ok = (isinstance(v.file, str) and isinstance(v.passed, bool) and isinstance(v.check, str)
                and isinstance(v.seen, str) and (v.hint is None or isinstance(v.hint, str))
                and isinstance(v.shown, int))
    return v if kinds_ok else None


def _all(folder: Path) -> dict:
    try:
        data = json.loads((folder / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(folder: Path, name: str, verdict: Verdict) -> None:
    data = _all(folder)
    data[name] = asdict(verdict)
    try:
        write_text(folder / FILE, json.dumps(data, indent=1) + "\n")
    except OSError:   # a folder the learner may read but not write: the check's verdict still stands
        pass
