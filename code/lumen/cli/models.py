"""What the subcommands share: the model argument and its loading (failures as one-line errors), and the
text the inspection tools read (a corpus cut into windows of tokens)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from ..runtime import cpu
from . import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODEL_HELP = "smollm2, a .gguf file, a Hugging Face directory, hf:ORG/NAME[@REVISION] or a lumen run directory"


def add_model_argument(p: argparse.ArgumentParser, help: str = MODEL_HELP) -> None:
    p.add_argument("model", help=help)


def add_out_argument(p: argparse.ArgumentParser, help: str, *old_names: str, default: str | None = None) -> None:
    """--out DIR, the one name of every command's output folder; old spellings still parse, unlisted."""
    p.add_argument("--out", metavar="DIR", default=default, type=path_text, help=help)
    for name in old_names:
        p.add_argument(name, dest="out", metavar="DIR", type=path_text, help=argparse.SUPPRESS)


def path_text(text: str) -> str:
    """An argparse type: a path, not empty (an empty one would mean the current folder, by accident)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a path")
    return text


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def rate(text: str) -> float:
    """An argparse type: a learning rate, a finite number above 0."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def finite(text: str) -> float:
    """An argparse type: a finite number."""
    value = _number(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def add_quiet_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (they are also off when stderr is not a terminal)")


def output_dir(path: str | Path, option: str = "--out") -> Path:
    """A folder to write into (created when written), checked before anything is computed: no part of it is a
    file and the nearest existing folder can be written (lumen.files.check_writable)."""
    from ..files import check_writable

    return check_writable(path, option)


def output_file(path: str | Path, option: str = "--out") -> Path:
    """A file to write (its folder created when written), checked like `output_dir`: not an existing folder."""
    from ..files import check_writable

    return check_writable(path, option, folder=False)


def input_file(path: str | Path, option: str, what: str = "file", hint: str = "check the path") -> Path:
    """A file the command reads, checked before the model is loaded (which can take a minute): it is there, a
    regular file, and can be opened; a missing or unreadable one is one line naming the option and the path."""
    from ..errors import MissingFileError

    p = Path(path).expanduser()
    if not p.exists():
        raise MissingFileError(f"{option}: no {what} at {path} ({hint})")
    if not p.is_file():
        raise UserError(f"{option} {path} is a folder, not a {what}: give the file" if p.is_dir() else
                        f"{option} {path} is not a regular file: give a {what}")
    try:
        with open(p, "rb"):
            pass
    except OSError as e:
        raise UserError(f"{option} {path} cannot be read ({e.strerror or e}): fix its permissions") from None
    return p


def check_corpus(spec: str, option: str = "--corpus") -> None:
    """A corpus given by path (files, folders or globs), checked before the model is loaded: every path is there
    (the files are read later, with the model's tokenizer, by lumen.data.read_corpus); "shakespeare" is built in."""
    import glob

    from ..errors import MissingFileError

    if spec == "shakespeare" or not spec.strip():   # (an empty one: read_corpus says so)
        return
    p = Path(spec).expanduser()
    if p.exists():
        return
    if glob.has_magic(spec):
        if not glob.glob(str(p), recursive=True):
            raise MissingFileError(f"{option} {spec!r}: the glob matches no files (check the pattern)")
        return
    raise MissingFileError(f"{option} {spec}: no such file or directory (give text files or folders, or the "
                           "built-in shakespeare)")


def at_least(args: argparse.Namespace, *names: str, least: int = 1) -> None:
    """Refuse counts below `least` for the named options (dest names), with the option as typed."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < least:
            raise UserError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")


def add_text_arguments(p: argparse.ArgumentParser, seq_len: int, windows: int | None = None) -> None:
    """--corpus, --seq-len, --seed (and --windows when given a default): the text a tool reads."""
    p.add_argument("--corpus", default="shakespeare", help="text files/directories, or shakespeare (built in)")
    if windows is not None:
        p.add_argument("--windows", type=int, default=windows, help="text windows to read")
    p.add_argument("--seq-len", type=int, default=seq_len, help="tokens per window")
    p.add_argument("--seed", type=int, default=0, help="which windows are drawn")


def read_windows(model, tok, args: argparse.Namespace, split: str, count: int, seed: int,
                 counted: str = "--windows") -> torch.Tensor:
    """count windows of args.seq_len tokens of args.corpus (its train or val split), within the model's context;
    `counted` names the options that set count, for the message when it is more than lumen reads."""
    from ..inspect.corpus import MAX_TOKENS, token_windows

    if args.seq_len > model.cfg.context:
        raise UserError(f"--seq-len {args.seq_len} exceeds the model's context of {model.cfg.context}")
    if count * args.seq_len > MAX_TOKENS:
        raise UserError(f"{counted} ({count:,} windows) x --seq-len {args.seq_len:,} is {count * args.seq_len:,} "
                        f"tokens, more than a command reads ({MAX_TOKENS:,}): give fewer")
    return token_windows(tok, args.corpus, split, count, args.seq_len, seed)


def load_model(spec: str, dtype: str = "float32", weights: str = "float"):
    """lumen.formats.load(spec), or with weights="gguf" the speed wing's lumen.fast.load_quantized(spec) (a
    GGUF's quantized blocks kept as stored); a failed download is a UserError."""
    from ..fetch import FetchError
    from ..formats import load

    try:
        if weights == "gguf":
            from ..fast import load_quantized

            if dtype != "float32":
                raise UserError("--weights gguf computes in float32 from the file's blocks (drop --dtype)")
            return load_quantized(spec)
        emulated = cpu.emulated_bf16() if dtype == "bfloat16" else None
        if emulated:  # (a decoded token's single row is not slower: it reads half the memory)
            print(f"lumen: {emulated}", file=sys.stderr)
        return load(spec, dtype=DTYPES[dtype])
    except FetchError as e:
        raise UserError(str(e)) from None


def load_with_tokenizer(spec: str, dtype: str = "float32"):
    """(model, tokenizer) of a spec, for the tools that read text: a spec without a tokenizer is an error."""
    loaded = load_model(spec, dtype)
    if loaded.tokenizer is None:
        raise UserError(f"{spec} has no tokenizer saved with it (the tools need one to read text)")
    return loaded.model, loaded.tokenizer


def checkpoint_note(spec: str) -> str | None:
    """Which checkpoint of a lumen run directory a command reads (its best by validation loss, which may
    not be its latest), and why, to say on stderr; None for any other spec."""
    from pathlib import Path

    from ..formats.checkpoint import choose, is_checkpoint, step_folders

    path = Path(spec)
    if not path.is_dir() or is_checkpoint(path) or not step_folders(path):
        return None
    chosen, why = choose(path)
    return f"read {chosen} ({why})"
