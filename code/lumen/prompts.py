"""A file of prompts: the dataset `lumen lens`, `attribute` and `patch` read with --prompts FILE, and
lumen.inspect.datasets runs as padded batches (lumen.tokenizers.pad), each prompt on its own and on average.

    >>> prompts = read_prompts("ioi.jsonl", tok, model.cfg.context)      # doctest: +SKIP
    >>> prompts[0].line, prompts[0].text                                  # doctest: +SKIP
    (1, 'When Mary and John went to the store, John gave a drink to')
    >>> prompts[0].answer == tok.single_token(" Mary")                    # doctest: +SKIP
    True

Two layouts, told apart by the first line:

    plain text    one prompt per line, as written (no blank lines; the line end, LF, CR LF or CR, is not part of it)
    JSON lines    one object a line: {"prompt": "...", "answer": " Mary", "wrong": " John"} for lens and
                  attribute, {"clean": "...", "corrupt": "...", "answer": ..., "wrong": ...} for patch;
                  answer and wrong are optional, single tokens, and given on every line or on none

Everything wrong in a file is one line naming the file, the line and the fix (a UserError), before any
forward pass runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import UserError
from .files import json_object, read_text
from .progress import progress
from .tokenizers import Batch, Tokenizer, pad, single_token

MAX_PROMPTS = 4096               # the most prompts one command reads (split a larger dataset)
MAX_BYTES = 16 * 2**20           # the largest prompt file read
MAX_BATCH_BYTES = 2 * 2**30      # the logits (B, T, V) of one batch, float32, at most
BATCH_SIZE = 8

PROMPT_FIELDS = ("prompt", "answer", "wrong")
PAIR_FIELDS = ("clean", "corrupt", "answer", "wrong")


# the indirect-object task (Wang et al. 2022): "When {A} and {B} went to the store, {S} gave a drink to" asks for
# the name that is not the subject's; experiments/ioi.py builds its dataset from these, features/study.py its pairs
IOI_TEMPLATES = (
    "When {A} and {B} went to the store, {S} gave a drink to",
    "When {A} and {B} went to the park, {S} gave a ball to",
    "After {A} and {B} went to the office, {S} gave a letter to",
    "Then, {A} and {B} had a long argument, and afterwards {S} said to",
    "While {A} and {B} were working at the school, {S} handed a book to",
    "The day {A} and {B} went to the beach, {S} threw a towel to",
    "Friends {A} and {B} found a bag at the station. {S} gave it to",
    "Once {A} and {B} got to the party, {S} passed a cake to",
)
IOI_NAMES = ("Mary", "John", "Tom", "James", "Sarah", "Paul", "Mark", "Anna", "Kate", "Lisa", "Mike", "Emma", "David",
             "Alice", "Peter", "Laura", "Chris", "Jane", "Adam", "Susan")


@dataclass(frozen=True)
class Prompt:
    """One line of a prompt file, tokenized: a prompt (for patch, a clean prompt and its corrupted twin)
    and the answers its metric compares, when the line names them."""

    line: int
    text: str
    ids: list[int]
    answer: int | None = None
    wrong: int | None = None
    corrupt: str | None = None
    corrupt_ids: list[int] | None = None


def read_prompts(path: str | Path, tok: Tokenizer, context: int, pairs: bool = False) -> list[Prompt]:
    """The prompts of a file, tokenized and checked (see the module docstring)."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():   # a device or a pipe may never end
        raise UserError(f"{path} is not a regular file: give a text file of prompts")
    if path.is_file() and path.stat().st_size > MAX_BYTES:
        raise UserError(f"{path} is {path.stat().st_size:,} bytes, more than a command reads ({MAX_BYTES:,}): "
                        "split it into smaller files")
    lines = re.split(r"\r\n|\r|\n", read_text(path, "prompt", UserError, "fix the file"))   # Unix, Windows, old Mac
    if lines and lines[-1] == "":
        lines.pop()   # the line end that ends the last line
    if not lines:
        raise UserError(f"{path} is empty: give one prompt per line")
    if len(lines) > MAX_PROMPTS:
        raise UserError(f"{path} holds {len(lines):,} lines, more prompts than a command reads at once "
                        f"({MAX_PROMPTS:,}): split it into smaller files")
    for n, t in enumerate(lines, 1):
        if not t.strip():
            raise UserError(f"{path}, line {n}: a blank line; give one prompt per line (remove it)")
    jsonl = lines[0].lstrip().startswith("{")
    if pairs and not jsonl:
        raise UserError(f"{path}, line 1: patch reads pairs, one JSON object a line: "
                        '{"clean": "...", "corrupt": "..."} (answer and wrong optional)')
    fields = PAIR_FIELDS if pairs else PROMPT_FIELDS
    records = [_record(path, n, t, fields, 2 if pairs else 1) if jsonl else {"prompt": t}
               for n, t in enumerate(lines, 1)]
    for key in ("answer", "wrong"):
        given = [key in r for r in records]
        if any(given) and not all(given):
            n = given.index(not given[0]) + 1
            raise UserError(f"{path}, line {n}: {'has' if given[n - 1] else 'lacks'} an {key!r} that line 1 "
                            f"{'lacks' if given[n - 1] else 'has'}: give it on every line or on none")
    return [_tokenized(path, n, r, tok, context, pairs) for n, r in enumerate(records, 1)]


def _record(path: Path, n: int, text: str, fields: Sequence[str], n_required: int) -> dict:
    """One JSON line's object, its fields checked: the required ones present, every one a non-empty string."""
    r = json_object(text, path, "prompt", UserError, "give one JSON object a line", line=n)
    unknown = [k for k in r if k not in fields]
    if unknown:
        raise UserError(f"{path}, line {n}: unknown field {unknown[0]!r}; the fields are {', '.join(fields)}")
    required = fields[:n_required]
    for k in required:
        if k not in r:
            raise UserError(f"{path}, line {n}: no {k!r} field; each line needs {' and '.join(map(repr, required))}")
    for k, v in r.items():
        if not isinstance(v, str) or not v:
            raise UserError(f"{path}, line {n}: {k!r} must be a non-empty string, got {v!r}")
    if "wrong" in r and "answer" not in r:
        raise UserError(f"{path}, line {n}: a 'wrong' token without an 'answer': give both, or only the answer")
    return r


def _tokenized(path: Path, n: int, r: dict, tok, context: int, pairs: bool) -> Prompt:
    where = f"{path}, line {n}:"
    try:
        return _tokens(where, r, tok, context, pairs, n)
    except UserError as e:   # the tokenizer's own complaint (a character it lacks) gets the file and the line
        if str(e).startswith(where):
            raise
        raise UserError(f"{where} {e}") from None


def _tokens(where: str, r: dict, tok, context: int, pairs: bool, n: int) -> Prompt:
    text = r["clean"] if pairs else r["prompt"]
    ids = _ids(where, "clean prompt" if pairs else "prompt", text, tok, context)
    answer = single_token(tok, r["answer"], f"{where} the answer") if "answer" in r else None
    wrong = single_token(tok, r["wrong"], f"{where} the wrong token") if "wrong" in r else None
    if answer is not None and answer == wrong:
        raise UserError(f"{where} the answer and the wrong token are both {r['answer']!r}: give two different tokens")
    if not pairs:
        return Prompt(n, text, ids, answer, wrong)
    corrupt = _ids(where, "corrupted prompt", r["corrupt"], tok, context)
    if len(corrupt) != len(ids):
        raise UserError(f"{where} the clean prompt is {len(ids)} tokens and the corrupted one {len(corrupt)}: each "
                        "pair must tokenize to the same length")
    return Prompt(n, text, ids, answer, wrong, r["corrupt"], corrupt)


def _ids(where: str, what: str, text: str, tok, context: int) -> list[int]:
    ids = tok.encode(text)
    if not ids:
        raise UserError(f"{where} the {what} is empty (no tokens): give it some text")
    if len(ids) > context:
        raise UserError(f"{where} the {what} is {len(ids):,} tokens, more than the model's context of {context:,} "
                        "(shorten it)")
    return ids


def batches(prompts: Sequence[Prompt], batch_size: int, vocab_size: int, desc: str | None = None
            ) -> Iterator[list[Prompt]]:
    """The prompts in file order, batch_size at a time; a batch whose logits would pass MAX_BATCH_BYTES
    is refused with the fix (a smaller --batch-size) before it runs. With `desc`, a progress bar counts the
    prompts done (each batch counted when the caller asks for the next)."""
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    with progress(total=len(prompts), desc=desc, unit="prompt", silent=desc is None) as bar:
        for group in _groups(prompts, batch_size, vocab_size):
            yield group
            bar.update(len(group))


def _groups(prompts: Sequence[Prompt], batch_size: int, vocab_size: int) -> Iterator[list[Prompt]]:
    for start in range(0, len(prompts), batch_size):
        group = list(prompts[start : start + batch_size])
        T = max(len(p.ids) for p in group)
        need = len(group) * T * vocab_size * 4
        if need > MAX_BATCH_BYTES:
            longest = max(group, key=lambda p: len(p.ids))
            raise UserError(f"--batch-size {batch_size}: {len(group)} prompts padded to {T:,} tokens (line "
                            f"{longest.line}) x a vocabulary of {vocab_size:,} is {need / 2**30:.1f} GiB of logits, "
                            f"more than a batch may hold ({MAX_BATCH_BYTES / 2**30:.0f} GiB): give a smaller "
                            "--batch-size")
        yield group


def padded(group: Sequence[Prompt], corrupt: bool = False) -> Batch:
    """A group of prompts (or their corrupted twins) as one left-padded Batch."""
    return pad([p.corrupt_ids if corrupt and p.corrupt_ids is not None else p.ids for p in group], side="left")


def with_answers(prompts: Sequence[Prompt], answer: int | None, wrong: int | None, path: str) -> list[Prompt]:
    """The prompts, each given the command line's answer and wrong token (when the file names none)."""
    if answer is None and wrong is None:
        return list(prompts)
    if prompts[0].answer is not None:
        raise UserError(f"{path} names an answer on every line: leave out the command line's answer tokens")
    return [replace(p, answer=answer, wrong=wrong) for p in prompts]
