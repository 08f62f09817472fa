"""The chapter's Practice: exercises a reader solves in their own file, checked against lumen's own code.

Each exercise belongs to a section of the chapter and asks for a piece of it (a class, a function or a
number); its checks run the learner's code beside lumen's on random inputs and shapes and answer a known
mistake with a targeted hint. `lumen practice list|start|check|hint|solution` is the door; from Python:

    >>> from lumen import practice
    >>> [e.name for e in practice.EXERCISES.values()][:3]
    ['mixing', 'mlp', 'worked-mlp']
    >>> practice.exercise("layernorm").section
    'LayerNorm: keeping the stream well-behaved'
    >>> report = practice.check_file("layernorm", "layernorm.py")     # doctest: +SKIP
    >>> report.passed, [o.hint for o in report.failed]                # doctest: +SKIP
    (False, ['unbiased'])

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
from .blocks import BLOCK, DROPOUT, INIT, POST_LN
from .counting import COUNT, FLOPS
from .exercise import Check, Exercise, Mistake, Outcome, Report, Spec, run
from .inside import DELETE, KV, LENS
from .learner import PracticeError, load
from .mlp import GELU, MIXING, MLP_EXERCISE, SWIGLU_EXERCISE, WORKED
from .norms import LAYERNORM, RMSNORM
from .solution import Location, where

# in the chapter's order, each under the heading it practises
EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    MIXING, MLP_EXERCISE, WORKED, KV, GELU, SWIGLU_EXERCISE, DELETE, LAYERNORM, POST_LN, RMSNORM, BLOCK, LENS,
    COUNT, DROPOUT, INIT, FLOPS,
)}

__all__ = ["EXERCISES", "Check", "Exercise", "Location", "Mistake", "Outcome", "PracticeError", "Report", "Spec",
           "check_file", "exercise", "load", "run", "solutions", "where"]


def exercise(name: str) -> Exercise:
    """The exercise called `name`, or a UserError naming the closest ones."""
    if name in EXERCISES:
        return EXERCISES[name]
    close = difflib.get_close_matches(name, list(EXERCISES), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}?" if close else "`lumen practice list` names them"
    raise UserError(f"no exercise called {name!r}: {hint}")


def check_file(name: str, path: str | Path, seed: int = 0, smollm2: bool = True) -> Report:
    """Load the learner's file for exercise `name` and run its checks (SmolLM2 loaded when they need it)."""
    ex = exercise(name)
    return run(ex, load(path, ex), seed, _smollm2 if smollm2 else None)


@functools.cache
def _smollm2() -> Loaded:
    return load_model("smollm2")


def solutions(name: str) -> list[Location]:
    """Where lumen's own code for exercise `name` lives (file and lines, found by inspect)."""
    return [where(dotted) for dotted in exercise(name).solution]
