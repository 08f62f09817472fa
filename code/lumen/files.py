"""Writing output so that nothing is ever half-written: a temporary file (or folder) beside the target,
fsync, then one rename over it. A crash or a full disk leaves the previous version, never half of a new one.
And the two ends of every file lumen is given or writes: `read_json`/`read_toml`, the one reader of JSON and TOML
(its errors name the file and the place), and `check_writable`, the check of an output path before staging."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ConfigError, LumenError, MissingFileError, ModelFileError, UserError


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


# ---------------------------------------------------------------------------------------------
# reading the JSON and TOML files lumen is given: one reader, whose errors say the file and the place
def read_json(path: str | Path, what: str, error: type[LumenError] = ModelFileError,
              fix: str = "fix it, or save or fetch it again") -> dict:
    """The JSON object in a file. A file that is missing, unreadable, not UTF-8, not JSON or not an object is
    one `error` (ModelFileError unless told) naming the file, the line and column, and what is wrong there
    in plain words, e.g. `config.json, line 1, column 13: not valid JSON (a value was expected here)`.

        >>> read_json("runs/x/checkpoints/step-000100/config.json", "model config")   # doctest: +SKIP
    """
    path = Path(path)
    return json_object(_read_text(path, what, error, fix), path, what, error, fix)


def json_object(text: str, path: str | Path, what: str, error: type[LumenError] = ModelFileError,
                fix: str = "fix it", line: int | None = None) -> dict:
    """The JSON object in `text`, the contents of file `path` or, given `line`, that line of a JSON-lines file
    (one object a line); what is wrong with it is one `error` naming the file, the line and column, as `read_json`."""
    place = "file" if line is None else "line"
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        where = "" if not text.strip() else f", line {line or e.lineno}, column {e.colno}"
        if line is not None and not text.strip():
            where = f", line {line}"
        reason = f"the {place} is empty" if not text.strip() else _JSON_REASONS.get(e.msg, e.msg.lower())
        raise error(f"{path}{where}: not valid JSON ({reason}); {fix}") from None
    except ValueError:   # json's only other complaint: an integer longer than Python converts (4,300 digits)
        where = "" if line is None else f", line {line}"
        raise error(f"{path}{where}: not a {what} {place} (a number in it has more digits than Python "
                    f"reads, 4,300); {fix}") from None
    except RecursionError:
        where = "" if line is None else f", line {line}"
        raise error(f"{path}{where}: not a {what} {place} (its JSON is nested too deeply to read); {fix}") from None
    if not isinstance(d, dict):
        kind = {list: "a list", str: "a string", type(None): "null", bool: "true or false"}.get(type(d), "a number")
        where = "" if line is None else f", line {line},"
        raise error(f"{path}{where} holds {kind}, not the JSON object of a {what} {place}; {fix}")
    return d


def read_text(path: str | Path, what: str, error: type[LumenError] = ModelFileError, fix: str = "fix it") -> str:
    """A text file lumen is given, as UTF-8 (a leading byte-order mark dropped): a file that is missing,
    unreadable or not UTF-8 is one `error` naming it (and the line, for bytes that are not UTF-8)."""
    return _read_text(Path(path), what, error, fix)


def read_toml(path: str | Path, what: str, error: type[LumenError] = ConfigError, fix: str = "fix it") -> dict:
    """The tables of a TOML file; what is wrong with it is one `error` (ConfigError unless told) naming the file,
    the line and column and the problem in plain words, like `read_json`."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    path = Path(path)
    text = _read_text(path, what, error, fix)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.fullmatch(r"(.*?) \((?:at line (\d+), column (\d+)|at end of document)\)", str(e), re.S)
        reason, line, column = (m.group(1), m.group(2), m.group(3)) if m else (str(e), None, None)
        where = f", line {line}, column {column}" if line else ", at its end"
        for start, plain in _TOML_REASONS.items():
            if reason.startswith(start):
                reason = plain
        raise error(f"{path}{where}: not valid TOML ({reason[:1].lower() + reason[1:]}); {fix}") from None


def _read_text(path: Path, what: str, error: type[LumenError], fix: str) -> str:
    """A file's UTF-8 text (a leading byte-order mark dropped)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MissingFileError(f"no {what} file at {path}") from None
    except IsADirectoryError:
        raise error(f"{path} is a folder, not a {what} file") from None
    except OSError as e:
        raise error(f"{path} cannot be read ({e.strerror or type(e).__name__}): check its permissions") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(f"{path}, line {line}, column {column}: byte 0x{data[e.start]:02x} is not UTF-8 text "
                    f"(save the {what} file as UTF-8); {fix}") from None


_JSON_REASONS = {
    "Expecting value": "a value was expected here",
    "Expecting property name enclosed in double quotes": "a key in double quotes was expected here",
    "Expecting ':' delimiter": "a ':' was expected after the key",
    "Expecting ',' delimiter": "a ',' or a closing bracket was expected here",
    "Unterminated string starting at": "a string starts here and never ends",
    "Invalid control character at": "a control character such as a tab or newline inside a string",
    "Invalid \\escape": "an unknown backslash escape",
    "Invalid \\uXXXX escape": "a \\u escape without four hexadecimal digits",
    "Extra data": "more text after the JSON value ended",
}
_TOML_REASONS = {
    "Invalid value": "a value was expected here",
    "Cannot overwrite a value": "a key given a value twice",
    "Cannot declare": "a table declared twice",
    "Expected '=' after a key": "a key without '= value'",
    "Expected newline or end of document after a statement": "more text after a value on its line",
    "Unclosed array": "an array without its closing ']'",
    "Unclosed inline table": "an inline table without its closing '}'",
}


# ---------------------------------------------------------------------------------------------
# where output goes
def check_writable(path: str | Path, what: str, folder: bool = True, error: type[LumenError] = UserError) -> Path:
    """Before anything is computed or staged: `path` can be written. No part of it is a file (when a folder is
    wanted, `path` itself neither), a file to write is not an existing folder, and the nearest existing folder
    accepts new entries (tried: a hidden folder is made there and removed, so a read-only disk, /proc or a
    folder without permission fail now, in one line). Nothing is created. `what` names it in the message
    (an option such as "--out", or "out_dir").

        >>> check_writable("out/lens", "--out")                  # doctest: +SKIP
    """
    if not str(path).strip():
        raise error(f"{what} is empty: give a {'folder' if folder else 'file'} to write")
    path = Path(path)
    for p in (path, *path.parents) if folder else path.parents:
        if p.exists() and not p.is_dir():
            raise error(f"{what} {path}: {p} is a file, not a folder (give a {'folder' if p == path else 'path'} "
                        "to write into)")
    if not folder and path.is_dir():
        raise error(f"{what} {path} is a folder: give the path of a file to write")
    existing = next(p for p in (path, *path.parents) if p.exists())
    try:
        shutil.rmtree(tempfile.mkdtemp(dir=existing, prefix=".lumen-write-check-"))
    except OSError as e:
        raise error(f"{what} {path}: cannot write into {existing.resolve()} ({e.strerror or type(e).__name__}); "
                    "choose a folder you can write") from None
    return path
