"""The learner's file, imported by its path, and held to what the exercise asks it to define.

A file that cannot be used (missing, a syntax error, an exception while importing, a missing name, a
signature the checks cannot call) is a `PracticeError`: one line naming the file, what is wrong and what
to do; the `lumen` command prints it and exits with 2.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import torch.nn as nn

from ..errors import MissingFileError, UserError
from .exercise import Exercise, Spec


class PracticeError(UserError):
    """A learner's file that cannot be checked: it does not import, or does not define what the exercise asks."""


def load(path: str | Path, exercise: Exercise) -> ModuleType:
    """Import the file at `path` as a fresh module (never cached in sys.modules) and check that it defines
    every name of the exercise with a signature the checks can call."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such file (write one with `lumen practice start {exercise.name}`)")
    name = f"lumen_practice_{exercise.name.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PracticeError(f"{path}: not a Python file that can be imported (name it {exercise.file_name})")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise PracticeError(f"{path}:{e.lineno}: syntax error: {e.msg} (fix it and check again)") from None
    except BaseException as e:  # noqa: BLE001  (whatever the learner's file raised while importing, exits too)
        # importlib makes the file's name absolute in the traceback: compare resolved paths, not as typed
        frames = [f for f in traceback.extract_tb(e.__traceback__) if _same_file(f.filename, path)]
        line = f":{frames[-1].lineno}" if frames else ""
        raise PracticeError(f"{path}{line}: importing it raised {type(e).__name__}: {_short(e)} "
                            "(fix it and check again)") from None
    finally:
        sys.modules.pop(name, None)
    for s in exercise.specs:
        _check_spec(path, module, s, exercise)
    return module


def _check_spec(path: Path, module: ModuleType, s: Spec, exercise: Exercise) -> None:
    again = f"`lumen practice start {exercise.name}` writes a file that has it"
    if not hasattr(module, s.name):
        raise PracticeError(f"{path}: defines no {s.name}; the exercise asks for {s.shown} ({again})")
    obj = getattr(module, s.name)
    if s.kind == "value":
        return
    if s.kind == "class":
        if not inspect.isclass(obj) or (s.module and not issubclass(obj, nn.Module)):
            raise PracticeError(f"{path}: {s.name} is not a class{' (an nn.Module)' if s.module else ''}; "
                                f"the exercise asks for {s.shown}")
        _bindable(path, s, obj, s.args, s.kwargs, s.name)
        cls: Any = obj
        if s.forward_args:
            _bindable(path, s, cls.forward, ("self", *s.forward_args), {}, f"{s.name}.forward")
        return
    if not callable(obj):
        raise PracticeError(f"{path}: {s.name} is not a function; the exercise asks for {s.shown}")
    _bindable(path, s, obj, s.args, s.kwargs, s.name)


def _bindable(path: Path, s: Spec, fn, args: tuple, kwargs: dict, what: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):   # a builtin without a signature: let the checks call it
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise PracticeError(f"{path}: {what}{sig} cannot be called as the exercise calls it ({e}); "
                            f"it asks for {s.shown}") from None


def _same_file(filename: str, path: Path) -> bool:
    try:
        return Path(filename).resolve() == path.resolve()
    except (OSError, RuntimeError):
        return False


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 160 else text[:157] + "..."
