"""The chapter's Practice: exercises a reader solves in their own file, checked against lumen's own code.

Each exercise belongs to a section of the chapter and asks for a piece of it (a class, a function or a
number); its checks run the learner's code beside lumen's on random inputs and shapes and recognise known
mistakes by name. The hint for one comes in steps (exercise.Hint: what to look at, the formula, the fix),
`lumen practice hint` giving one step at a time for the mistake the last check saw (kept by verdict.py in
the learner's folder). `lumen practice list|start|check|hint|solution` is the door; from Python:

    >>> from lumen import practice
    >>> [e.name for e in practice.EXERCISES.values()][:3]
    ['mixing', 'mlp', 'worked-mlp']
    >>> practice.exercise("layernorm").section
    'LayerNorm: keeping the stream well-behaved'
    >>> report = practice.check_file("layernorm", "layernorm.py")     # doctest: +SKIP
    >>> report.passed, [o.hint for o in report.failed]                # doctest: +SKIP
    (False, ['unbiased'])

`check_file` runs the learner's code apart (apart.py): in a process of its own, with a time and a memory
limit, answering the checks' inputs with plain data; lumen's reference and the comparisons stay in the
checker's process, where the learner's code cannot reach them. `run(exercise, load(path, exercise))` runs a
trusted file (lumen's own solutions) in this process.

The checks use torch and lumen alone (no test framework), so they run from a plain install; the two that
read SmolLM2 (logit-lens, kv-memory) load it with lumen.formats.load("smollm2") from lumen's cache.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from ..errors import UserError
from ..formats import Loaded
from ..formats import load as load_model
from .apart import MEMORY, TIMEOUT, Sandbox
from .blocks import BLOCK, DROPOUT, INIT, POST_LN
from .counting import COUNT, FLOPS
from .exercise import Check, Exercise, Hint, Mistake, Outcome, Report, Spec, run
from .inside import DELETE, KV, LENS
from .learner import PracticeError, load
from .mlp import GELU, MIXING, MLP_EXERCISE, SWIGLU_EXERCISE, WORKED
from .norms import LAYERNORM, RMSNORM
from .sandwich import SANDWICH
from .solution import Location, where

# in the chapter's order, each under the heading it practises
EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    MIXING, MLP_EXERCISE, WORKED, KV, GELU, SWIGLU_EXERCISE, DELETE, LAYERNORM, POST_LN, RMSNORM, BLOCK, SANDWICH,
    LENS,
    COUNT, DROPOUT, INIT, FLOPS,
)}

__all__ = ["EXERCISES", "Check", "Exercise", "Hint", "Location", "Mistake", "Outcome", "PracticeError", "Report",
           "Sandbox", "Spec", "check_file", "exercise", "load", "run", "solutions", "where"]


def exercise(name: str) -> Exercise:
    """The exercise called `name`, or a UserError naming the closest ones."""
    if name in EXERCISES:
        return EXERCISES[name]
    close = difflib.get_close_matches(name, list(EXERCISES), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}?" if close else "`lumen practice list` names them"
    raise UserError(f"no exercise called {name!r}: {hint}")


def check_file(name: str, path: str | Path, seed: int = 0, smollm2: bool = True, timeout: float = TIMEOUT,
               memory: float = MEMORY) -> Report:
    """Run the checks of exercise `name` on the learner's file, its code run apart: `timeout` seconds of it per
    check, `memory` GiB (SmolLM2 loaded when the checks need it)."""
    ex = exercise(name)
    load_smollm2 = _smollm2 if smollm2 else None
    with Sandbox(path, ex, timeout, memory, load_smollm2) as learner:
        return run(ex, learner, seed, load_smollm2)


@functools.cache
def _smollm2() -> Loaded:
    return load_model("smollm2")


def solutions(name: str) -> list[Location]:
    """Where lumen's own code for exercise `name` lives (file and lines, found by inspect)."""
    return [where(dotted) for dotted in exercise(name).solution]
