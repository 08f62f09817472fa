"""The learner's side of a check: the process (a fork of the checker) where the learner's file is imported and
its code called, and nothing else is decided.

It answers the checker's requests one at a time: load the file, seed torch, get a name of the learner's
module, call one of the learner's functions, classes or modules on the inputs the checker sent. It sends back
only plain data (wire.py): tensors, numbers, and for a learner's nn.Module a description the checker mirrors
(its parameters, buffers and submodules) with a handle to call it by. Whatever the learner's code patches here
(torch.allclose, lumen's own classes, a report) stays here: the verdict is the checker's, in its own process.
"""

from __future__ import annotations

import inspect
import numbers
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..model import GPT
from . import wire
from .exercise import Exercise, _learner_line, _one_line
from .learner import PracticeError, load


def serve(rfd: int, wfd: int, path: Path, exercise: Exercise, memory: int,
          smollm2: Callable[[], Any] | None) -> None:
    """Answer requests until the checker closes its end (or the learner's code ends the process)."""
    _limit_memory(memory)
    torch.set_num_threads(1)
    side = LearnerSide(path, exercise, smollm2)
    while True:
        try:
            header, blob = wire.receive(rfd)
        except wire.Closed:
            return
        wire.send(wfd, *side.answer(header, blob))


def _limit_memory(extra: int) -> None:
    """At most `extra` bytes of address space beyond what the fork inherited (where the system says how much)."""
    try:
        import resource

        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))
    except (ImportError, OSError, ValueError, StopIteration):
        pass   # no /proc (macOS) or no rlimits (Windows): the time limit still holds


class LearnerSide:
    def __init__(self, path: Path, exercise: Exercise, smollm2: Callable[[], Any] | None):
        self.path, self.exercise, self.smollm2 = path, exercise, smollm2
        self.objects: dict[int, Any] = {}   # handle -> a learner object the checker holds a mirror of
        self.models: list[tuple[nn.Module, dict]] = []   # the checker's models sent with this request

    def answer(self, header: dict, blob: bytes) -> tuple[dict, wire.Packer]:
        packer = wire.Packer(self._describe)
        try:
            return self._answer(header, blob, packer), packer
        except PracticeError as e:
            return {"error": str(e)}, wire.Packer()
        except BaseException as e:  # noqa: BLE001  (SystemExit too: the learner's code raised it)
            base = next(c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins")
            where = _learner_line(e, self.objects[0]) if 0 in self.objects else None
            return {"raised": {"type": type(e).__name__, "base": base, "message": _one_line(e),
                               "where": where}}, wire.Packer()

    def _answer(self, header: dict, blob: bytes, packer: wire.Packer) -> dict:
        op = header.get("op")
        if op == "load":
            self.objects[0] = load(self.path, self.exercise)
            return {"ok": True, "lumens": self._lumens()}
        if op == "seed":
            torch.manual_seed(header["seed"])
            random.seed(header["seed"])
            return {"ok": True}
        target = self.objects[header["id"]]
        if op == "get":
            return {"value": packer.value(getattr(target, header["name"]))}
        if op != "call":
            raise ValueError(f"no request {op!r}")
        unpacker = wire.Unpacker(blob, self._decode)
        self.models = []
        if header.get("sync"):
            self._sync(header["sync"], unpacker)
        args, kwargs = unpacker.value(header["args"]), unpacker.value(header["kwargs"])
        value = target(*args, **kwargs)
        return {"value": packer.value(value), "models": [self._changes(i, packer) for i in range(len(self.models))]}

    def _lumens(self) -> dict[str, str]:
        """The names asked for that are lumen's own code, imported (a class whose forward is lumen's too)."""
        out = {}
        for s in self.exercise.specs:
            obj = getattr(self.objects[0], s.name)
            for part in (obj, getattr(obj, "forward", None) if inspect.isclass(obj) else None):
                module = getattr(part, "__module__", None) or ""
                if module == "lumen" or module.startswith("lumen."):
                    out[s.name] = f"{module}.{getattr(part, '__qualname__', s.name)}"
                    break
        return out

    @torch.no_grad()
    def _sync(self, sync: dict, unpacker: wire.Unpacker) -> None:
        """The checker's edits of a mirrored module (parameters set, train/eval) applied to the learner's own."""
        root: nn.Module = self.objects[sync["root"]]
        tensors: dict[str, torch.Tensor] = dict(root.named_parameters(remove_duplicate=False))
        tensors.update(root.named_buffers(remove_duplicate=False))
        for name, entry in sync["tensors"].items():
            tensors[name].copy_(unpacker.tensor(entry))
        for name, module in root.named_modules(remove_duplicate=False):
            if name in sync["training"]:
                module.training = bool(sync["training"][name])

    def _changes(self, i: int, packer: wire.Packer) -> dict:
        """What the learner's code did to the i-th model the checker sent: the tensors it changed, or how its
        structure changed."""
        model, sent = self.models[i]
        now = model.state_dict()
        if now.keys() != sent.keys() or any(now[k].shape != sent[k].shape for k in now):
            gone, new = sorted(sent.keys() - now.keys()), sorted(now.keys() - sent.keys())
            what = (f"{len(gone)} of its tensors gone ({gone[0]}, ...)" if gone else
                    f"{len(new)} tensors added ({new[0]}, ...)" if new else "a tensor of another shape")
            return {"structure": what}
        return {"tensors": {k: packer.tensor(now[k]) for k in now if not torch.equal(now[k], sent[k])}}

    # -- what comes in: the checker's inputs --------------------------------------------------------------------

    def _decode(self, tag: str, entry: dict, unpacker: wire.Unpacker) -> Any:
        if tag == "config":
            return ModelConfig.from_dict(unpacker.value(entry["v"]))
        if tag == "handle":
            return self.objects[entry["id"]]
        if tag == "smollm2":
            assert self.smollm2 is not None
            return self.smollm2().model
        if tag == "model":
            cfg = ModelConfig.from_dict(unpacker.value(entry["config"]))
            with torch.random.fork_rng():   # building it must not move the learner's generator
                model = GPT(cfg)
            state = unpacker.value(entry["state"])
            model.load_state_dict(state)
            model.train(bool(entry["training"]))
            self.models.append((model, state))
            return model
        raise ValueError(f"no input tagged {tag!r}")

    # -- what goes out: the learner's answers -------------------------------------------------------------------

    def _handle(self, obj: Any) -> int:
        h = len(self.objects) + 1
        self.objects[h] = obj
        return h

    def _describe(self, v: Any, packer: wire.Packer) -> Any:
        if isinstance(v, nn.Module):
            return self._module(v, packer, set())
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, numbers.Real):
            return float(v)
        if callable(v):
            return {"$": "callable", "id": self._handle(v), "name": getattr(v, "__name__", type(v).__name__)}
        return {"$": "object", "type": type(v).__name__}

    def _module(self, module: nn.Module, packer: wire.Packer, seen: set[int]) -> dict:
        """The module as the checker mirrors it: parameters, buffers, plain tensor and number attributes, and
        submodules (each with a handle of its own)."""
        seen.add(id(module))
        params = {n: {**packer.tensor(p), "grad": p.requires_grad} for n, p in module._parameters.items()
                  if p is not None}
        buffers = {n: packer.tensor(b) for n, b in module._buffers.items() if b is not None}
        children = {n: self._module(c, packer, seen) for n, c in module._modules.items()
                    if c is not None and id(c) not in seen}
        attrs: dict[str, Any] = {}
        for name, v in vars(module).items():
            if name.startswith("_") or name == "training":
                continue
            if isinstance(v, torch.Tensor):
                attrs[name] = packer.tensor(v)
            elif v is None or isinstance(v, bool | int | float | str):
                attrs[name] = v
            elif callable(v) and not inspect.isclass(v):
                attrs[name] = self._describe(v, packer)
        return {"$": "module", "id": self._handle(module), "type": type(module).__name__,
                "training": bool(module.training), "params": params, "buffers": buffers, "attrs": attrs,
                "children": children}
