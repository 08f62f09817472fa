"""Writing output so that nothing is ever half-written: a temporary file (or folder) beside the target,
fsync, then one rename over it. A crash or a full disk leaves the previous version, never half of a new one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path` in one step, on error it is removed.

        >>> with atomic_path("out/lens.png") as tmp:             # doctest: +SKIP
        ...     fig.savefig(tmp, format="png")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())   # the permissions of an ordinary new file, not mkstemp's 0600
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success every file in it is fsync'ed and the folder replaces
    `path` in one rename (an existing folder there is moved aside first, then removed); on error it is removed.

    Hidden names beside the target: `.tmp-NAME-*` while writing, `.old-NAME` while replacing
    (`recover_dir` tidies both after a crash).

        >>> with atomic_dir("runs/x/checkpoints/step-100") as tmp:   # doctest: +SKIP
        ...     save_file(state, str(tmp / "model.safetensors"))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".tmp-{path.name}-"))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.chmod(f, 0o666 & ~_umask())
        os.chmod(tmp, 0o777 & ~_umask())   # mkdtemp makes 0700; an ordinary new folder is readable by others
        fsync_dir(tmp)
        if path.exists():  # replacing: move the old one aside first, then drop it
            old = path.with_name(f".old-{path.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def recover_dir(parent: str | Path, is_complete: Callable[[Path], bool]) -> None:
    """After a crash inside `atomic_dir`: drop half-written folders (.tmp-*) under `parent`, and put back a
    folder that was being replaced (.old-NAME) unless a complete NAME is already there."""
    parent = Path(parent)
    if not parent.is_dir():
        return
    for p in parent.iterdir():
        if p.name.startswith(".tmp-"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(".old-"):
            final = p.with_name(p.name[len(".old-"):])
            if is_complete(final):
                shutil.rmtree(p, ignore_errors=True)
            else:
                shutil.rmtree(final, ignore_errors=True)
                os.replace(p, final)


def fsync_dir(path: str | Path) -> None:
    """Make a folder's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str) -> Path:
    """Write a text file atomically; returns its path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
