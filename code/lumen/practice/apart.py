"""The learner's code, run apart: a process of its own, a time limit, a memory limit, answers as plain data.

`Sandbox(path, exercise)` forks a process that imports the learner's file (child.py) and gives a `Learner`:
a stand-in for the learner's module that the checks use as they would the module itself. Getting a name
asks the learner's process for it; calling one of the learner's functions sends the checker's inputs there
and brings the answer back; a learner's nn.Module comes back as a `Remote`: its parameters and submodules
mirrored here (a check reads, sets, randomises and counts them as on any module), its forward run there
on every call. A lumen model given to the learner's code travels as its config and weights, and the weights
the learner's code changed travel back.

Everything the checks compare (lumen's reference, torch.allclose, the verdict) stays in this process, where
the learner's code never runs: what it patches, it patches in its own. What it does to its process shows
here as `Stopped`: "ended the process (exit code 0)", "timed out after 60 s".
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..errors import MissingFileError, UserError
from ..model import GPT
from . import child, wire
from .exercise import Exercise, Mistake, Raised, Stopped, _one_line
from .learner import PracticeError

_EXIT = os._exit   # taken now: the learner's code may replace os._exit in its process, never this
TIMEOUT = 60.0   # seconds of the learner's code per check (and for importing the file)
MEMORY = 4.0     # GiB of address space beyond the checker's own


class Sandbox:
    """The learner's file imported in a process of its own; `with Sandbox(...) as learner:` runs the checks."""

    def __init__(self, path: str | Path, exercise: Exercise, timeout: float = TIMEOUT, memory: float = MEMORY,
                 smollm2: Callable[[], Any] | None = None):
        self.path, self.exercise, self.timeout, self.memory = Path(path), exercise, timeout, memory
        self.smollm2 = smollm2          # the child loads SmolLM2 with it (an inherited copy if loaded already)
        self.named: dict[int, str] = {}  # id of a model the child has by name ("smollm2")
        self.pid, self.wfd, self.rfd = 0, -1, -1
        self.left = timeout
        self.stopped: Stopped | None = None
        self.lumens: dict[str, str] = {}   # a name asked for -> lumen's own code it is (imported)

    def __enter__(self) -> Learner:
        if not self.path.is_file():
            raise MissingFileError(f"{self.path}: no such file (write one with `lumen practice start "
                                   f"{self.exercise.name}`)")
        self._fork()
        try:
            reply, _ = self.ask({"op": "load"})
        except Stopped as s:
            self.close()
            raise PracticeError(f"{self.path}: importing it {s.what} ({s.advice})") from None
        except Raised as r:   # raised past the import's own handling: still the learner's file
            self.close()
            raise PracticeError(f"{self.path}: importing it raised {r.kind}: {r.message} (fix it and check "
                                "again)") from None
        except BaseException:
            self.close()
            raise
        lumens = reply.get("lumens")
        self.lumens = {str(k)[:100]: str(v)[:200] for k, v in lumens.items()} if isinstance(lumens, dict) else {}
        return Learner(self)

    def notes(self) -> list[str]:
        """What the report says besides the checks: the names that are lumen's own code, imported."""
        return [f"{name} is lumen's own {dotted}, imported rather than written in your file: the checks ran "
                "lumen's code (write your own to practise)" for name, dotted in self.lumens.items()]

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fork(self) -> None:
        if not hasattr(os, "fork"):
            raise UserError("lumen practice check runs your code in a process of its own, forked, and this system "
                            "has no fork (Windows): run it under WSL")
        to_child, from_parent = os.pipe()[::-1]
        from_child, to_parent = os.pipe()
        sys.stdout.flush()   # else the child holds a copy of what is not yet written
        sys.stderr.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)   # "fork in a multi-threaded process"
            pid = os.fork()
        if pid == 0:   # the learner's process: never returns into the checker's code
            code = 0
            try:
                os.close(to_child)
                os.close(from_child)
                os.setpgid(0, 0)   # its own group: closing ends whatever it started too
                child.serve(from_parent, to_parent, self.path, self.exercise, int(self.memory * 2**30), self.smollm2)
            except BaseException:  # noqa: BLE001
                code = 70
            finally:
                _EXIT(code)
        os.close(from_parent)
        os.close(to_parent)
        os.set_blocking(to_child, False)
        self.pid, self.wfd, self.rfd = pid, to_child, from_child

    def close(self) -> None:
        if self.wfd >= 0:
            os.close(self.wfd)
            os.close(self.rfd)
            self.wfd = self.rfd = -1
        if self.pid:
            self._end()

    def _end(self) -> int:
        """Kill the learner's process (and what it started) and return how it ended (os.waitstatus_to_exitcode)."""
        pid, self.pid = self.pid, 0
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    # -- requests -------------------------------------------------------------------------------------------

    def begin(self, seed: int) -> None:
        """A new check: the time limit starts again, and the learner's generator is seeded as ours is."""
        self.left = self.timeout
        self.ask({"op": "seed", "seed": seed})

    def ask(self, header: dict, packer: wire.Packer | None = None) -> tuple[dict, wire.Unpacker]:
        """Send one request and read its answer, within what is left of the time limit."""
        if self.stopped is not None:
            raise self.stopped
        start = time.monotonic()
        try:
            wire.send(self.wfd, header, packer or wire.Packer(), start + self.left)
            reply, blob = wire.receive(self.rfd, start + self.left)
        except wire.Late:
            self._end()
            self._stop(f"timed out after {self.timeout:g} s (an endless loop? a sleep?)", "timeout")
        except wire.Closed:
            code = self._end()
            how = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
            self._stop(f"ended the process ({how})", "ended")
        except wire.Garbled as e:
            self._garbled(e)
        finally:
            self.left -= time.monotonic() - start
        if "error" in reply:
            raise PracticeError(str(reply["error"]))
        if "raised" in reply:
            raise Raised.of(reply["raised"])
        return reply, wire.Unpacker(blob, self._decode)

    def _stop(self, what: str, hint: str) -> NoReturn:
        self.stopped = Stopped(what, hint)
        raise self.stopped

    def get(self, handle: int, name: str) -> Any:
        reply, unpacker = self.ask({"op": "get", "id": handle, "name": name})
        return self._value(reply, unpacker)

    def call(self, handle: int, args: tuple, kwargs: dict, root: Remote | None = None) -> Any:
        models: list[nn.Module] = []
        packer = wire.Packer(lambda v, p: self._encode(v, p, models))
        header = {"op": "call", "id": handle, "args": packer.value(args), "kwargs": packer.value(kwargs),
                  "sync": root._edits(packer) if root is not None else None}
        reply, unpacker = self.ask(header, packer)
        value = self._value(reply, unpacker)
        try:
            for model, change in zip(models, _checked(reply.get("models"), list)):
                self._apply(model, _checked(change, dict), unpacker)
        except (wire.Garbled, RuntimeError) as e:
            self._garbled(e)
        return value

    def _value(self, reply: dict, unpacker: wire.Unpacker) -> Any:
        try:
            return unpacker.value(reply.get("value"))
        except (wire.Garbled, KeyError, TypeError, ValueError, RuntimeError, RecursionError) as e:
            self._garbled(e)

    def _garbled(self, e: Exception) -> NoReturn:
        self._end()
        self._stop(f"sent something that is not an answer ({_one_line(e)})", "ended")

    @torch.no_grad()
    def _apply(self, model: nn.Module, change: dict, unpacker: wire.Unpacker) -> None:
        """The learner's code changed a model it was given: the same change here, where the checks look."""
        if "structure" in change:
            hint = "restore" if "restore" in self.exercise.hints else "task"
            raise Mistake(f"your code changed the model it was given ({_checked(change['structure'], str)}): "
                          "it must leave the model as it found it", hint)
        state = model.state_dict()
        for name, entry in _checked(change.get("tensors"), dict).items():
            t = unpacker.tensor(entry)
            if name not in state or state[name].shape != t.shape:
                raise wire.Garbled(f"a change to {name!r}, which the model does not have")
            state[name].copy_(t)

    # -- the checker's inputs, as plain data -----------------------------------------------------------------

    def watch(self, load: Callable[[], Any]) -> Callable[[], Any]:
        """`load` (giving SmolLM2), noting the model it gives: sent to the child by name, not weight by weight."""
        def loaded() -> Any:
            out = load()
            if self.smollm2 is not None:
                self.named[id(out.model)] = "smollm2"
            return out
        return loaded

    def _encode(self, v: Any, packer: wire.Packer, models: list[nn.Module]) -> Any:
        if isinstance(v, Remote):
            return {"$": "handle", "id": v._handle}
        if isinstance(v, ModelConfig):
            return {"$": "config", "v": packer.value(v.to_dict())}
        if isinstance(v, GPT):
            if id(v) in self.named:
                return {"$": self.named[id(v)]}
            models.append(v)
            return {"$": "model", "config": packer.value(v.cfg.to_dict()), "training": v.training,
                    "state": packer.value(dict(v.state_dict()))}
        raise TypeError(f"a check gave the learner's code a {type(v).__name__}, which cannot be sent")

    # -- the learner's answers, as objects here --------------------------------------------------------------

    def _decode(self, tag: str, entry: dict, unpacker: wire.Unpacker) -> Any:
        if tag == "module":
            return _mirror(self, entry, unpacker, None)
        if tag == "callable":
            return RemoteCallable(self, _checked(entry.get("id"), int), _name(entry.get("name")))
        if tag == "object":
            return _kind(Opaque, _name(entry.get("type")))()
        raise wire.Garbled(f"an object tagged {tag!r}")


def _checked(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise wire.Garbled(f"a {type(value).__name__} where a {kind.__name__} belongs")
    return value


def _name(value: Any) -> str:
    return value if isinstance(value, str) and value.isidentifier() and len(value) <= 100 else "object"


_KINDS: dict[tuple[type, str], type] = {}


def _kind(base: type, name: str) -> type:
    """A subclass of base called `name`, so that a message reads "LayerNorm has no attribute 'g'"."""
    if (base, name) not in _KINDS:
        _KINDS[base, name] = type(name, (base,), {"__module__": "learner"})
    return _KINDS[base, name]


class Learner:
    """The learner's module, as the checks see it: each name is asked of the learner's process."""

    def __init__(self, box: Sandbox):
        self.__dict__["_lumen_box"] = box

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._lumen_box.get(0, name)


class Opaque:
    """Something the learner's code gave that is not data (its type's name is kept for the messages)."""


class RemoteCallable:
    """One of the learner's functions or classes: calling it runs it in the learner's process."""

    def __init__(self, box: Sandbox, handle: int, name: str, root: Remote | None = None):
        self._box, self._handle, self.__name__, self._root = box, handle, name, root

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._box.call(self._handle, args, kwargs, self._root)


class Remote(nn.Module):
    """A learner's nn.Module, living in the learner's process: its parameters, buffers and submodules mirrored
    here, its forward run there. The mirror's edits (parameters set, train/eval) go with the next call."""

    _box: Sandbox
    _handle: int
    _root: Remote
    _sent: dict[str, torch.Tensor]

    def __init__(self, box: Sandbox, handle: int, root: Remote | None):
        super().__init__()
        self.__dict__.update(_box=box, _handle=handle, _root=root if root is not None else self)
        self.__dict__["_sent"] = {}   # the root's: each tensor as the child last had it

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._box.call(self._handle, args, kwargs, self._root)

    def _edits(self, packer: wire.Packer) -> dict:
        """What changed here since the child last saw it: tensors by name, and every module's mode."""
        named = [*self.named_parameters(remove_duplicate=False), *self.named_buffers(remove_duplicate=False)]
        tensors = {}
        for name, t in named:
            if name not in self._sent or not torch.equal(self._sent[name], t):
                tensors[name] = packer.tensor(t)
                self._sent[name] = t.detach().clone()
        return {"root": self._handle, "tensors": tensors,
                "training": {n: m.training for n, m in self.named_modules(remove_duplicate=False)}}


def _mirror(box: Sandbox, desc: dict, unpacker: wire.Unpacker, root: Remote | None, prefix: str = "") -> Remote:
    remote = _kind(Remote, _name(desc.get("type")))(box, _checked(desc.get("id"), int), root)
    top = remote if root is None else root
    remote.training = bool(desc.get("training"))
    try:
        for name, e in _checked(desc.get("params"), dict).items():
            t = unpacker.tensor(e)
            remote.register_parameter(name, nn.Parameter(t, requires_grad=bool(e.get("grad")) and
                                                         t.is_floating_point()))
            top._sent[prefix + name] = t.clone()
        for name, e in _checked(desc.get("buffers"), dict).items():
            remote.register_buffer(name, unpacker.tensor(e))
            top._sent[prefix + name] = remote._buffers[name].clone()
        for name, e in _checked(desc.get("children"), dict).items():
            remote.add_module(name, _mirror(box, _checked(e, dict), unpacker, top, f"{prefix}{name}."))
        for name, v in _checked(desc.get("attrs"), dict).items():
            if not hasattr(remote, name):
                value = unpacker.value(v)
                if isinstance(value, RemoteCallable):
                    value._root = top
                object.__setattr__(remote, name, value)
    except (KeyError, TypeError, AttributeError) as e:
        raise wire.Garbled(f"a module that cannot be mirrored ({e})") from None
    return remote
