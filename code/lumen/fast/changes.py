"""The one way the speed wing changes things for a while: each change recorded with its undoing, all undone
on leaving, the last first, however the block is left (an exception too).

    >>> import torch.nn as nn
    >>> layer = nn.Linear(2, 2)
    >>> with Changes() as changes:
    ...     changes.set_class(layer, nn.Identity)
    ...     type(layer).__name__
    'Identity'
    >>> type(layer).__name__
    'Linear'

A module swapped for another, a module's class swapped, an attribute added, a process setting changed: the
same record (an ExitStack's callbacks), so `lumen.fast.decoding` leaves the model, and the process, as it
found them.
"""

from __future__ import annotations

import contextlib

import torch.nn as nn


class Changes(contextlib.ExitStack):
    """Changes made until the block ends, each undone then (ExitStack: `callback(undo)` records a change made
    any other way, `enter_context(cm)` a context manager's)."""

    def set(self, obj: object, name: str, value: object) -> None:
        """obj.name = value until undone: the old value back (a child module: the same object), or the
        attribute deleted if obj did not have one of its own."""
        had = name in vars(obj) or (isinstance(obj, nn.Module)
                                    and any(name in d for d in (obj._modules, obj._parameters, obj._buffers)))
        old = getattr(obj, name, None)
        setattr(obj, name, value)
        self.callback(setattr, obj, name, old) if had else self.callback(delattr, obj, name)

    def set_class(self, obj: object, cls: type) -> None:
        """obj's class is cls until undone (the same object, the same state: only its methods change)."""
        old = type(obj)
        obj.__class__ = cls
        self.callback(setattr, obj, "__class__", old)
