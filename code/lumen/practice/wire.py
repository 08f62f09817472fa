"""What passes between the checker and the learner's process: plain data, never pickles.

A message is one frame: two lengths, a JSON header, then the raw bytes of every tensor it carries. Inside
the header a value is JSON (None, bool, int, float, str) or a tagged object {"$": tag, ...}: a tensor (its
dtype, shape and place in the bytes), a tuple, a list, a dict with str keys, Ellipsis; anything else is
left to the side that sends it (`special`), e.g. a handle on the learner's module. Reading never runs code
the other side chose: the checker reads what the learner's process sends with json and torch.frombuffer.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from collections.abc import Callable
from typing import Any

import torch

MAX_BYTES = 1 << 31   # one message: a learner's answer is small; a bigger frame is garbage

DTYPES = {str(t).removeprefix("torch."): t for t in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}


class Garbled(Exception):
    """A frame that is not a message this module wrote."""


class Closed(Exception):
    """The other side closed its end (its process ended)."""


class Late(Exception):
    """The deadline passed before the other side answered."""


# -- values <-> JSON + bytes ----------------------------------------------------------------------------------

class Packer:
    """Turns a value into JSON, collecting tensors' bytes; `special(value)` encodes what plain data cannot."""

    def __init__(self, special: Callable[[Any, Packer], Any] | None = None):
        self.special = special
        self.chunks: list[bytes] = []
        self.size = 0

    def tensor(self, t: torch.Tensor) -> dict:
        t = t.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        entry = {"$": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                 "at": self.size, "n": len(raw), "param": isinstance(t, torch.nn.Parameter)}
        self.chunks.append(raw)
        self.size += len(raw)
        return entry

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, bool | str):
            return v
        if isinstance(v, int | float):
            return int(v) if isinstance(v, int) else float(v)
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if v is Ellipsis:
            return {"$": "..."}
        if type(v) in (tuple, list):
            return {"$": type(v).__name__, "v": [self.value(x) for x in v]}
        if type(v) is dict and all(isinstance(k, str) for k in v):
            return {"$": "dict", "v": {k: self.value(x) for k, x in v.items()}}
        if self.special is not None:
            return self.special(v, self)
        raise TypeError(f"cannot send a {type(v).__name__}")


class Unpacker:
    """The inverse of Packer for a frame's bytes; `special(tag, entry, unpacker)` decodes the other tags."""

    def __init__(self, blob: bytes, special: Callable[[str, dict, Unpacker], Any] | None = None):
        self.blob, self.special = bytearray(blob), special

    def tensor(self, e: dict) -> torch.Tensor:
        dtype, shape, at, n = DTYPES.get(str(e.get("dtype"))), e.get("shape"), e.get("at"), e.get("n")
        if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape) \
                or not isinstance(at, int) or not isinstance(n, int) or at < 0 or at + n > len(self.blob):
            raise Garbled("a tensor entry that does not fit the message")
        numel = 1
        for s in shape:
            numel *= s
        if numel * torch.empty((), dtype=dtype).element_size() != n:
            raise Garbled("a tensor whose bytes do not match its shape")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.blob, dtype=dtype, count=numel, offset=at).reshape(shape).clone()

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if isinstance(v, list):
            raise Garbled("a bare list (lists are tagged)")
        if not isinstance(v, dict) or not isinstance(v.get("$"), str):
            raise Garbled("an untagged object")
        tag = v["$"]
        if tag == "tensor":
            return self.tensor(v)
        if tag == "...":
            return Ellipsis
        if tag in ("tuple", "list"):
            items = v.get("v")
            if not isinstance(items, list):
                raise Garbled(f"a {tag} without items")
            out = [self.value(x) for x in items]
            return tuple(out) if tag == "tuple" else out
        if tag == "dict":
            items = v.get("v")
            if not isinstance(items, dict):
                raise Garbled("a dict without items")
            return {str(k): self.value(x) for k, x in items.items()}
        if self.special is not None:
            return self.special(tag, v, self)
        raise Garbled(f"an object tagged {tag!r}")


# -- frames over a pipe ---------------------------------------------------------------------------------------

HEAD = struct.Struct("<QQ")


def send(fd: int, header: dict, packer: Packer, deadline: float | None = None) -> None:
    """Write one frame; with a deadline, give up (Late) when the reader does not take it in time."""
    head = json.dumps(header).encode()
    data = memoryview(b"".join([HEAD.pack(len(head), packer.size), head, *packer.chunks]))
    while data:
        _wait(fd, deadline, write=True)
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            continue
        except (BrokenPipeError, OSError) as e:
            raise Closed(str(e)) from None
        data = data[n:]


def receive(fd: int, deadline: float | None = None) -> tuple[dict, bytes]:
    """Read one frame: (header, bytes). Closed at end of file, Late past the deadline, Garbled if malformed."""
    n_head, n_blob = HEAD.unpack(_read(fd, HEAD.size, deadline))
    if n_head > MAX_BYTES or n_blob > MAX_BYTES:
        raise Garbled("a frame larger than any answer")
    try:
        header = json.loads(_read(fd, n_head, deadline))
    except (ValueError, RecursionError):
        raise Garbled("a header that is not JSON") from None
    if not isinstance(header, dict):
        raise Garbled("a header that is not an object")
    return header, _read(fd, n_blob, deadline)


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    parts, left = [], n
    while left:
        _wait(fd, deadline, write=False)
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise Closed("end of file")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _wait(fd: int, deadline: float | None, write: bool) -> None:
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise Late()
    ready = select.select([], [fd], [], left)[1] if write else select.select([fd], [], [], left)[0]
    if not ready:
        raise Late()
