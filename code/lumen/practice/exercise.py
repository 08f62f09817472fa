"""What an exercise is, and how its checks run on a learner's file.

An exercise names what the learner's file must define (`Spec`), holds its checks in order, and its hints:
"task" (the nudge: what to write) first, then one hint per mistake people make. A check passes by returning;
it fails by raising `Mistake(seen, hint)`: what it saw, and the key of the hint that answers it. A check
that fails stops the checks after it (they are reported as skipped) unless it is marked `gate=False`
(independent questions, e.g. several numbers asked in one exercise). `run(exercise, learner)` gives a
`Report`: its outcomes in order, `passed`, and the `failed` ones with the hint each names.

The learner is the learner's module, or (as `lumen practice check` runs it) apart.Learner, its stand-in for
the learner's code run in a process of its own: there the learner's code raising is a `Raised` (its type,
message and line), and the process ending or running out of time a `Stopped`, after which nothing more can
be checked.
"""

from __future__ import annotations

import builtins
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


class Raised(Exception):
    """The learner's code raised, in its own process: its type's name, its message and the learner's line.

    `Raised.of` gives an instance that is also the built-in exception it derives from (a RuntimeError stays
    one), so a check that catches a shape error still catches it; SystemExit and the like become plain
    Exceptions here: only the learner's process may end."""

    kind, message = "Exception", ""
    where: str | None = None

    @staticmethod
    def of(raised: object) -> Raised:
        info = raised if isinstance(raised, dict) else {}
        kind, base = str(info.get("type", "Exception"))[:100], str(info.get("base", ""))
        builtin = getattr(builtins, base, None)
        cls: type[Raised] = Raised
        if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin is not Exception:
            try:
                cls = _RAISED.setdefault((kind, base), type(kind, (Raised, builtin), {"__module__": "learner"}))
            except TypeError:   # a built-in whose layout cannot be mixed in (OSError's family)
                pass
        e = cls(_one_line(str(info.get("message", ""))))
        e.kind, e.message = kind, _one_line(str(info.get("message", "")))
        e.where = str(info["where"])[:300] if isinstance(info.get("where"), str) else None
        return e


_RAISED: dict[tuple[str, str], type[Raised]] = {}
ENDING = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")


class Stopped(Exception):
    """The learner's process is gone: it ended, ran out of time, or sent what is not an answer."""

    ADVICE = {"ended": "remove the exit: importing the file must only define your answers"}

    def __init__(self, what: str, hint: str):
        super().__init__(what)
        self.what, self.hint = what, hint
        self.advice = self.ADVICE.get(hint, "fix it and check again")

    @property
    def seen(self) -> str:
        return f"your code {self.what}" + (" before the checks finished" if self.what.startswith("ended") else "")


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
    """One thing checked: its description and the function that checks it. An exception the learner's code
    raises inside it is reported as it is (type, message, the learner's line) with no hint: a check names a
    mistake only by recognising it (`Mistake(seen, hint)`)."""

    name: str
    run: Callable[[ModuleType, Context], None]
    gate: bool = True
    smollm2: bool = False   # reads the real SmolLM2 (skipped when a run is asked not to load it)


@dataclass(frozen=True)
class Hint:
    """A hint in the three steps `lumen practice hint` gives one at a time: where the mistake shows (without
    naming the fix), the formula or rule the code must follow, and the fix itself."""

    look: str
    formula: str
    fix: str


STEPS = ("what to look at", "the formula", "the fix")   # the steps of a hint, in order

# the hints of any exercise: what the learner's code did to the process it runs in (the "formula" here is the
# rule the checks run under)
PROCESS_HINTS = {
    "ended": Hint(
        "the lines that run when your file is imported and when the checked function is called: does one of them "
        "end the program instead of giving a value back?",
        "A check imports your file, calls what it defines and compares what comes back: an answer is a value "
        "returned (or a name defined), and the checks run in a process of their own that must stay alive.",
        "Return your answer: os._exit, sys.exit, exit(), quit() and raising SystemExit end the process your "
        "code runs in, so the checks see no answer (and never a pass)."),
    "timeout": Hint(
        "the loops in your code (does each one's condition ever change?), and any call that waits for the "
        "clock or the keyboard.",
        "Each check runs with a time limit (--timeout, 60 s by default); the exercises' inputs are small, so the "
        "formula computed once over the whole tensor takes well under a second.",
        "Make every loop end, or replace it with one tensor operation over the whole input; remove sleeps and "
        "input(). If your code is only slow, give it more time with --timeout."),
    "memory": Hint(
        "the tensors your code creates: is one far bigger than the inputs (one dimension per pair of tokens or "
        "of features, a copy per loop turn, a list that keeps growing)?",
        "Each check runs with a memory limit (--memory, 4 GiB by default); the exercises' inputs take a few "
        "megabytes at most, and so do the formula's intermediate results.",
        "Compute the formula without the huge intermediate (reduce along one axis at a time, let broadcasting "
        "do the pairing, free what a loop no longer needs); if it really needs more, give it more with --memory."),
}


@dataclass(frozen=True)
class Exercise:
    name: str          # as typed: `lumen practice check layernorm`
    section: str       # the chapter's heading it belongs to
    title: str         # one line for `lumen practice list`
    task: str          # what to write (the starting file's docstring)
    template: str      # the starting file's code, after its docstring
    specs: tuple[Spec, ...]
    checks: tuple[Check, ...]
    hints: dict[str, str | Hint]   # "task" first (the nudge), then one per known mistake: its fix, or its steps
    solution: tuple[str, ...]  # lumen's own code, as dotted names (lumen.block.LayerNorm)

    @property
    def file_name(self) -> str:
        return self.name.replace("-", "_") + ".py"

    def hint(self, key: str) -> str:
        """The fix of hint `key`: the exercise's own, or one about the process the learner's code ran in."""
        h = self.hints.get(key) or PROCESS_HINTS[key]
        return h.fix if isinstance(h, Hint) else h

    def steps(self, check: str, seen: str, key: str | None) -> list[tuple[str, str]]:
        """The hint for what a check saw, as (title, text) steps given one at a time: what to look at, the
        formula, the fix.

        Every known mistake, and what the code did to its process (ended, ran out of time or memory), has its
        own three steps (`Hint`); a mistake written as a plain fix would get its first two from the check (what
        it saw) and the task's nudge. An exception no check recognised (`key` None) has no fix to give, only
        where it was raised and the formula."""
        task = self.hints["task"]
        formula = task.formula if isinstance(task, Hint) else task
        look = f"it saw: {seen}. Find the line of your file that computes what it compared."
        if key is None:
            return [(STEPS[0], f"{seen}: an exception, not one of the mistakes the checks know. Read that line "
                               "of your file and what the exception says about it."), (STEPS[1], formula)]
        if key == "task":
            return [(STEPS[0], f"{seen}: your file's docstring says what to write."), (STEPS[1], formula),
                    ("lumen's own code", f"`lumen practice solution {self.name}` (try the formula first)")]
        h = self.hints.get(key) or PROCESS_HINTS[key]
        if isinstance(h, Hint):
            return list(zip(STEPS, (h.look, h.formula, h.fix)))
        return list(zip(STEPS, (look, formula, h)))

    @property
    def reads_smollm2(self) -> bool:
        return any(c.smollm2 for c in self.checks)

    def starting_file(self) -> str:
        """The file `lumen practice start` writes: the task as its docstring, then the code to complete."""
        doc = "\n".join(line.rstrip() for line in self.task.strip().splitlines())
        return (f'"""Exercise {self.name} (the chapter, "{self.section}").\n\n{doc}\n\n'
                f'Check it:  lumen practice check {self.name} {self.file_name}\n'
                f'A hint:    lumen practice hint {self.name}   (for the mistake the check saw; --more: the next '
                f'step)\n"""\n\n{self.template.lstrip()}')


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
    notes: list[str] = field(default_factory=list)   # e.g. a name the learner imported from lumen

    @property
    def passed(self) -> bool:
        return all(o.status == "passed" for o in self.outcomes)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]


def run(exercise: Exercise, learner: Any, seed: int = 0, smollm2: Callable[[], Any] | None = None) -> Report:
    """Every check of `exercise` on the learner's module (or apart.Learner, its stand-in), in order. SmolLM2's
    checks need `smollm2`, a function giving `lumen.formats.load("smollm2")` (called when first needed);
    without it they are skipped."""
    box = getattr(learner, "__dict__", {}).get("_lumen_box")   # the learner's code runs apart (apart.Sandbox)
    ctx = Context(seed, box.watch(smollm2) if box is not None and smollm2 is not None else smollm2)
    outcomes: list[Outcome] = []
    blocked: str | None = None
    for i, check in enumerate(exercise.checks):
        if blocked:
            outcomes.append(Outcome(check.name, "skipped", blocked))
            continue
        if check.smollm2 and smollm2 is None:
            outcomes.append(Outcome(check.name, "skipped", "needs SmolLM2 (not loaded in this run)"))
            continue
        try:
            with torch.random.fork_rng():   # the learner's code may draw from torch's generator: ours stays put
                torch.manual_seed(seed * 1000 + i)
                if box is not None:
                    box.begin(seed * 1000 + i)
                check.run(learner, ctx)
        except Mistake as m:
            outcomes.append(Outcome(check.name, "failed", m.seen, m.hint))
        except Stopped as s:
            outcomes.append(Outcome(check.name, "failed", s.seen, s.hint))
            blocked = "nothing more can be checked: your code's process is gone"
            continue
        except Exception as e:  # noqa: BLE001  (the learner's code raised: that is what the check saw)
            outcomes.append(_raised(e, learner, check))
        else:
            outcomes.append(Outcome(check.name, "passed"))
            continue
        if check.gate:
            blocked = "fix the failure above first"
    return Report(exercise, outcomes, box.notes() if box is not None else [])


def _raised(e: Exception, learner: Any, check: Check) -> Outcome:
    """What a check saw when the learner's code raised e (raised again when lumen's own check raised it)."""
    if isinstance(e, Raised):
        kind, message, where = e.kind, e.message, e.where
    else:
        kind, message, where = type(e).__name__, _one_line(e), _learner_line(e, learner)
        if (where is None and not isinstance(e, NotImplementedError)) or os.environ.get("LUMEN_DEBUG"):
            raise e   # raised by lumen's own check, not the learner's code: a bug in lumen
    at = f" ({where})" if where else ""
    if kind == "NotImplementedError":
        return Outcome(check.name, "failed", "not written yet (it raises NotImplementedError)", "task")
    if kind in ENDING:
        return Outcome(check.name, "failed", f"your code raised {kind}({message!r}){at} instead of returning an "
                       "answer", "ended")
    if kind == "MemoryError" or "can't allocate memory" in message or "not enough memory" in message:
        return Outcome(check.name, "failed", f"your code ran out of memory{at}: {message}", "memory")
    # an exception no check recognised: what it was and where, and no hint about some other mistake
    return Outcome(check.name, "failed", f"your code raised {kind}: {message}{at}", None)


def _learner_line(e: BaseException, learner: ModuleType) -> str | None:
    """'file.py line N': the last line of the learner's file in the exception's traceback, if any."""
    path = getattr(learner, "__file__", None)
    if path is None:
        return None
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == Path(path)]
    return f"{Path(path).name} line {frames[-1].lineno}" if frames else None


def _one_line(e: BaseException | str) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."
