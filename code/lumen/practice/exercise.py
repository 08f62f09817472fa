"""What an exercise is, and how its checks run on a learner's file.

An exercise names what the learner's file must define (`Spec`), holds its checks in order, and its hints:
"task" (the nudge: what to write) first, then one hint per mistake people make. A check passes by returning;
it fails by raising `Mistake(seen, hint)`: what it saw, and the key of the hint that answers it. A check
that fails stops the checks after it (they are reported as skipped) unless it is marked `gate=False`
(independent questions, e.g. several numbers asked in one exercise). `run(exercise, learner_module)` gives a
`Report`: its outcomes in order, `passed`, and the `failed` ones with the hint each names.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch


class Mistake(Exception):
    """A check saw something wrong: what it saw, and which hint answers it."""

    def __init__(self, seen: str, hint: str = "task"):
        super().__init__(seen)
        self.seen, self.hint = seen, hint


@dataclass(frozen=True)
class Spec:
    """One name the learner's file must define, and how the checks call it.

    kind: "class" (args/kwargs build one; forward_args are the names forward must take), "function"
    (args/kwargs call it) or "value" (a number to fill in). shown: the definition as the exercise asks it."""

    name: str
    kind: str
    shown: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    forward_args: tuple[str, ...] = ()
    module: bool = True   # a class must be an nn.Module


@dataclass
class Context:
    """What every check of one run shares: the seed, and SmolLM2 when the exercise reads it."""

    seed: int = 0
    load_smollm2: Callable[[], Any] | None = None   # -> lumen.formats.Loaded (cached by the caller)

    @property
    def smollm2(self) -> Any:
        """SmolLM2 as lumen.formats.load("smollm2") gives it, loaded when a check first needs it."""
        assert self.load_smollm2 is not None, "a SmolLM2 check ran without a loader"
        return self.load_smollm2()


@dataclass(frozen=True)
class Check:
    """One thing checked: its description, the function that checks it, and the hint shown when the
    learner's code raises an exception inside it."""

    name: str
    run: Callable[[ModuleType, Context], None]
    hint: str = "task"
    gate: bool = True
    smollm2: bool = False   # reads the real SmolLM2 (skipped when a run is asked not to load it)


@dataclass(frozen=True)
class Exercise:
    name: str          # as typed: `lumen practice check layernorm`
    section: str       # the chapter's heading it belongs to
    title: str         # one line for `lumen practice list`
    task: str          # what to write (the starting file's docstring)
    template: str      # the starting file's code, after its docstring
    specs: tuple[Spec, ...]
    checks: tuple[Check, ...]
    hints: dict[str, str]      # "task" first, then one per known mistake
    solution: tuple[str, ...]  # lumen's own code, as dotted names (lumen.block.LayerNorm)

    @property
    def file_name(self) -> str:
        return self.name.replace("-", "_") + ".py"

    @property
    def reads_smollm2(self) -> bool:
        return any(c.smollm2 for c in self.checks)

    def starting_file(self) -> str:
        """The file `lumen practice start` writes: the task as its docstring, then the code to complete."""
        doc = "\n".join(line.rstrip() for line in self.task.strip().splitlines())
        return (f'"""Exercise {self.name} (the chapter, "{self.section}").\n\n{doc}\n\n'
                f'Check it:  lumen practice check {self.name} {self.file_name}\n'
                f'A hint:    lumen practice hint {self.name}\n"""\n\n{self.template.lstrip()}')


@dataclass(frozen=True)
class Outcome:
    check: str
    status: str          # "passed", "failed" or "skipped"
    seen: str = ""
    hint: str | None = None


@dataclass
class Report:
    exercise: Exercise
    outcomes: list[Outcome]

    @property
    def passed(self) -> bool:
        return all(o.status == "passed" for o in self.outcomes)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]


def run(exercise: Exercise, learner: ModuleType, seed: int = 0, smollm2: Callable[[], Any] | None = None) -> Report:
    """Every check of `exercise` on the loaded learner module, in order. SmolLM2's checks need `smollm2`, a
    function giving `lumen.formats.load("smollm2")` (called when first needed); without it they are skipped."""
    ctx = Context(seed, smollm2)
    outcomes: list[Outcome] = []
    blocked = False
    for i, check in enumerate(exercise.checks):
        if blocked:
            outcomes.append(Outcome(check.name, "skipped", "fix the failure above first"))
            continue
        if check.smollm2 and smollm2 is None:
            outcomes.append(Outcome(check.name, "skipped", "needs SmolLM2 (not loaded in this run)"))
            continue
        try:
            with torch.random.fork_rng():   # the learner's code may draw from torch's generator: ours stays put
                torch.manual_seed(seed * 1000 + i)
                check.run(learner, ctx)
        except Mistake as m:
            outcomes.append(Outcome(check.name, "failed", m.seen, m.hint))
        except Exception as e:  # noqa: BLE001  (the learner's code raised: that is what the check saw)
            where = _learner_line(e, learner)
            if (where is None and not isinstance(e, NotImplementedError)) or os.environ.get("LUMEN_DEBUG"):
                raise   # raised by lumen's own check, not the learner's code: a bug in lumen
            seen = ("not written yet (it raises NotImplementedError)" if isinstance(e, NotImplementedError)
                    else f"your code raised {type(e).__name__}: {_one_line(e)} ({where})")
            outcomes.append(Outcome(check.name, "failed", seen,
                                    "task" if isinstance(e, NotImplementedError) else check.hint))
        else:
            outcomes.append(Outcome(check.name, "passed"))
            continue
        blocked = check.gate
    return Report(exercise, outcomes)


def _learner_line(e: BaseException, learner: ModuleType) -> str | None:
    """'file.py line N': the last line of the learner's file in the exception's traceback, if any."""
    path = getattr(learner, "__file__", None)
    if path is None:
        return None
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == Path(path)]
    return f"{Path(path).name} line {frames[-1].lineno}" if frames else None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."
