"""Fuzzing `lumen practice check` with hostile solutions: a learner's file that is wrong and also tries to end,
hang or fool the checker, through the real command line (`lumen.cli.main`, in this process, as the `lumen`
script runs it).

A case is one trick (below) put into a solution of one exercise that is wrong by construction: a file of
tests/practice_solutions/wrong (the trick at its top: it runs when the file is imported), or a no-op that
defines what the exercise asks with trivial bodies (the trick inside every function and forward: it runs
when a check calls the learner's code).

The property, for every case: never exit 0 (wrongly accepted); exit 1 with a FAILED check and the closing
"N failed, ..." line, or exit 2 with one line `lumen practice: error: ...` (a file that cannot be checked,
e.g. one that ends the process while importing); no traceback (ugly); done within CASE_SECONDS (a hang); and
nothing the learner's code patched (torch's comparisons, lumen's checks) reaches the checker's process.

By default every trick runs on one exercise (the quick ones taken in turn); `LUMEN_FUZZ_EXAMPLES=N` (any N > 0)
runs every trick on every exercise, in both places, the campaign of issue 38 (`LUMEN_FUZZ_TALLY=out.tsv`
writes each case's outcome and seconds):

    LUMEN_FUZZ_EXAMPLES=1 LUMEN_FUZZ_TALLY=/tmp/tally.tsv pytest -m fuzz tests/test_fuzz_practice.py
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lumen import practice
from lumen.cli import main

pytestmark = pytest.mark.fuzz

EVERY = int(os.environ.get("LUMEN_FUZZ_EXAMPLES", "0")) > 0
TIMEOUT = 1          # --timeout of a case (seconds of the learner's code per check)
CASE_SECONDS = 60    # wall-clock seconds a case may take: a loop stopped by --timeout takes TIMEOUT per check
WRONG = Path(__file__).resolve().parent / "practice_solutions" / "wrong"
CLOSING = re.compile(r"^\d+ failed, \d+ passed, \d+ skipped\.$")

# each trick: Python lines (run at import in a wrong file; inside every function of a no-op)
TRICKS = {
    "os._exit(0)": "import os; os._exit(0)",
    "sys.exit(0)": "import sys; sys.exit(0)",
    "SystemExit('all checks passed')": "raise SystemExit('all checks passed')",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "atexit os._exit(0)": "import atexit, os; atexit.register(os._exit, 0)",
    "SIGKILL itself": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    "an endless loop": "while True: pass",
    "a sleep": "import time; time.sleep(10_000)",
    "a huge tensor": "import torch; _huge = torch.ones(2**38)",
    "allclose/equal/isclose patched": "import torch; torch.allclose = torch.equal = lambda *a, **k: True; "
                                      "torch.isclose = lambda a, b, *r, **k: torch.ones_like(torch.as_tensor(a), "
                                      "dtype=torch.bool)",
    "randn/rand/randint patched": "import torch; torch.randn = lambda *s, **k: torch.zeros(*s); "
                                  "torch.rand = lambda *s, **k: torch.zeros(*s); "
                                  "torch.randint = lambda lo, hi=None, size=(1,), **k: "
                                  "torch.zeros(size, dtype=torch.long)",
    "lumen's comparisons patched": "import sys, lumen.practice; [setattr(m, n, (lambda *a, **k: None) if n == "
                                   "'expect_close' else (lambda *a, **k: False)) for m in list(sys.modules.values()) "
                                   "if getattr(m, '__name__', '').startswith('lumen.practice') for n in "
                                   "('differs', 'expect_close') if hasattr(m, n)]",
    "lumen's verdict patched": "import sys, lumen.practice; _e = sys.modules['lumen.practice.exercise']; "
                               "_e.Report.passed = property(lambda s: True); "
                               "_e.Report.failed = property(lambda s: []); "
                               "_e.Mistake.__init__ = lambda s, *a, **k: None",
    "lumen's command patched": "import lumen.cli.practice as _c, lumen.practice as _p; _c._check = lambda *a: 0; "
                               "_p.check_file = lambda *a, **k: None; _p.run = lambda *a, **k: None",
    "isinstance patched": "import builtins; builtins.isinstance = lambda *a: True",
    "a pass printed": "print('all checks passed.'); import sys; sys.stdout.flush()",
}


def _noop(ex: practice.Exercise, trick: str) -> str:
    """A file defining every name the exercise asks for, each trivial and wrong, the trick in every body."""
    body = f"    {trick}\n"
    lines = ["import torch", "import torch.nn as nn", ""]
    for s in ex.specs:
        if s.kind == "class":
            lines += [f"class {s.name}(nn.Module):", "    def __init__(self, *a, **k):", "        super().__init__()",
                      "        " + trick, "    def forward(self, x, *a, **k):", "    " + body + "        return x", ""]
        elif s.kind == "function":
            lines += [f"def {s.name}(*a, **k):", body + "    return a[0] if a else 0", ""]
        else:
            lines += [f"{s.name} = 0"]
    return "\n".join(lines) + "\n"


@dataclass
class Case:
    exercise: str
    trick: str
    where: str   # "import" (a wrong file, the trick on top) or "call" (a no-op, the trick in every body)

    def source(self) -> str:
        ex = practice.exercise(self.exercise)
        if self.where == "call":
            return _noop(ex, TRICKS[self.trick])
        wrong = sorted(WRONG.glob(f"{ex.name.replace('-', '_')}__*.py"))[0]
        return TRICKS[self.trick] + "\n" + wrong.read_text()

    def __repr__(self) -> str:
        return f"{self.exercise}/{self.where}/{self.trick}"


# the exercises whose checks take a second or more of lumen's own computing (GPT-2's count, a 24-block model,
# 200,000 dropout draws): in the full sweep only
HEAVY = ("count-params", "flops", "init", "dropout", "kv-memory")


def cases() -> list[Case]:
    if EVERY:
        return [Case(n, t, w) for n in practice.EXERCISES for t in TRICKS for w in ("import", "call")]
    names = [n for n in practice.EXERCISES if n not in HEAVY]
    return [Case(names[i % len(names)], t, ("call", "import")[i % 2]) for i, t in enumerate(TRICKS)]


def judge(case: Case, tmp_path: Path, capsys) -> str | None:
    """None when the case is refused as it should be, else what went wrong."""
    path = tmp_path / practice.exercise(case.exercise).file_name
    path.write_text(case.source())
    kept = (torch.allclose, torch.equal, torch.randn, isinstance, practice.check_file)
    start = time.monotonic()
    rc = main(["practice", "check", case.exercise, str(path), "--timeout", str(TIMEOUT)])
    seconds = time.monotonic() - start
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    if rc == 0:
        return "wrongly accepted"
    if seconds > CASE_SECONDS:
        return f"took {seconds:.0f} s"
    if "Traceback" in out + err:
        return "a traceback"
    if (torch.allclose, torch.equal, torch.randn, isinstance, practice.check_file) != kept:
        return "a patch reached the checker"
    if rc == 2:
        one = err.strip().splitlines()
        return None if len(one) == 1 and one[0].startswith("lumen practice: error: ") else f"exit 2 with {err!r}"
    if rc == 1 and "FAILED" in out and lines and CLOSING.match(lines[-1]):
        return None
    return f"exit {rc} with {out[-300:]!r} {err[-300:]!r}"


def test_hostile_solutions_never_pass_hang_or_crash(tmp_path, capsys):
    wrongs = []
    for i, case in enumerate(cases()):
        folder = tmp_path / str(i)
        folder.mkdir()
        start = time.monotonic()
        problem = judge(case, folder, capsys)
        if os.environ.get("LUMEN_FUZZ_TALLY"):
            with open(os.environ["LUMEN_FUZZ_TALLY"], "a") as f:
                f.write(f"{case!r}\t{problem or 'refused'}\t{time.monotonic() - start:.1f}\n")
        if problem:
            wrongs.append(f"{case!r}: {problem}")
    assert not wrongs, "\n".join(wrongs)
