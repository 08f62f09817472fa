"""Corpus -> tokenizer -> memory-mapped token files -> batches of random windows.

    >>> data = prepare("shakespeare", tokenizer="char")          # doctest: +SKIP
    >>> x, y = data.batch("train", torch.tensor([0, 1000]), 128)  # two windows, y is x shifted by one

A corpus is a list of documents (whole works, whole files). Validation holds out whole documents, so
no sentence of the validation text was seen in training. Tokenizing happens once: the token ids go
into `train.bin` / `val.bin` (uint16 when the vocabulary fits, else uint32) with `meta.json` and
`tokenizer.json`, in a cache folder named by a hash of the texts and the tokenizer settings. meta.json
holds each token file's size and sha256: a damaged cache folder is noticed and rebuilt, never used.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import CorpusError, LumenError, MissingFileError
from .fetch import fetch, sha256_of
from .files import atomic_dir, read_json
from .formats import read_tokenizer
from .runtime.cache import cache_dir
from .tokenizers import FILENAME as TOKENIZER_FILE
from .tokenizers import ByteTokenizer, CharTokenizer, Tokenizer, train_bpe

# The five works held out of the built-in Shakespeare corpus, one of each kind (tragedy, comedy,
# history, romance, Roman play): about 11% of its characters. Fixed, so every run, and the
# nanoGPT comparison in docs/training.md, validates on the same text.
SHAKESPEARE_VALIDATION = ("hamlet", "twelfth_night", "henry_v", "tempest", "julius_caesar")
TOKENIZERS = ("char", "byte", "bpe", "smollm2")  # or the path of a tokenizer.json
FORMAT_VERSION = 2  # 2: meta.json holds the sha256 of the token files and the tokenizer's


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def read_corpus(spec: str | list[str]) -> list[Document]:
    """The documents of a corpus: "shakespeare" (built in), or files, directories and globs.

    Directories are read recursively (every file not starting with "."), each file one document."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs or any(not isinstance(s, str) or not s.strip() for s in specs):
        raise CorpusError(f"corpus {spec!r} names nothing: give \"shakespeare\" or text files, directories or globs")
    if specs == ["shakespeare"]:
        folder = fetch("shakespeare")
        return [Document(p.name.removesuffix("_gut.txt"), p.read_text(encoding="utf-8"))
                for p in sorted(folder.glob("*_gut.txt"))]
    files: list[Path] = []
    for s in specs:
        p = Path(s).expanduser()
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        elif p.is_file():
            files.append(p)
        elif glob.has_magic(s):
            matched = sorted(Path(f) for f in glob.glob(os.path.expanduser(s), recursive=True))
            if not matched:
                raise MissingFileError(f"corpus glob {s!r} matches no files")
            files += [f for f in matched if f.is_file()]
        else:
            raise MissingFileError(f"corpus {s!r}: no such file or directory (or use the built-in 'shakespeare')")
    docs = [read_document(f) for f in files]
    texts = [d for d in docs if d.text]
    if not texts:
        empty = ", ".join(str(f) for f in files[:3]) + (", ..." if len(files) > 3 else "")
        found = f"{len(files)} empty file(s): {empty}" if files else "no files"
        raise CorpusError(f"corpus {spec!r} is empty ({found}); give files with text")
    return texts


def read_document(f: Path) -> Document:
    """One corpus file as a document: UTF-8 text (an empty file is an empty document); binary files refused."""
    try:
        data = f.read_bytes()
    except OSError as e:
        raise CorpusError(f"corpus file {f} cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"corpus file {f} is not UTF-8 text ({e.reason} at byte {e.start}); convert it to "
                          f"UTF-8 or leave it out of the corpus") from None
    if "\0" in text:
        raise CorpusError(f"corpus file {f} looks binary (it holds NUL bytes at byte {text.index(chr(0))}); "
                          f"leave it out of the corpus")
    return Document(str(f), text)


def split_documents(
    docs: list[Document], validation: list[str] | tuple[str, ...] | None = None, val_fraction: float = 0.1
) -> tuple[list[Document], list[Document]]:
    """(train, validation). Named documents are held out if given; otherwise the last documents that
    make up about val_fraction of the text, or, for a single document, its last val_fraction."""
    if validation:
        names = {d.name for d in docs}
        unknown = [v for v in validation if v not in names]
        if unknown:
            raise CorpusError(f"validation document(s) {unknown} are not in the corpus; documents: {sorted(names)}")
        val = [d for d in docs if d.name in validation]
        return [d for d in docs if d.name not in validation], val
    if not 0 < val_fraction < 1:
        raise CorpusError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if len(docs) == 1:
        text = docs[0].text
        cut = text.rfind("\n", 0, int(len(text) * (1 - val_fraction))) + 1 or int(len(text) * (1 - val_fraction))
        return [Document(docs[0].name, text[:cut])], [Document(docs[0].name + ":val", text[cut:])]
    total, held, k = sum(len(d.text) for d in docs), 0, len(docs)
    while k > 1 and held < val_fraction * total:
        k -= 1
        held += len(docs[k].text)
    return docs[:k], docs[k:]


def make_tokenizer(kind: str, train: list[Document], all_docs: list[Document], vocab_size: int) -> Tokenizer:
    """A tokenizer for the corpus: characters (of all its text), bytes, a BPE learned from the
    training documents, or a saved tokenizer.json."""
    if kind == "char":
        return CharTokenizer.from_text("".join(d.text for d in all_docs))
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return train_bpe((d.text for d in train), vocab_size)
    if kind == "smollm2":  # SmolLM2's own 49,152-token BPE, read from its GGUF file
        tok = read_tokenizer("smollm2")
        assert tok is not None  # a GGUF always carries its tokenizer
        return tok
    if Path(kind).exists():
        return Tokenizer.load(kind)
    raise CorpusError(f"unknown tokenizer {kind!r}; use one of {', '.join(TOKENIZERS)} or a tokenizer.json path")


def encode(tok: Tokenizer, docs: list[Document]) -> np.ndarray:
    """All documents' token ids in one array, an end-of-text token after each when the tokenizer has one."""
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    parts = []
    for d in docs:
        parts.append(np.asarray(tok.encode(d.text), dtype=dtype))
        if tok.eos_id is not None:
            parts.append(np.asarray([tok.eos_id], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


class TokenData:
    """The tokenized train and validation splits of a corpus, memory-mapped from the cache."""

    def __init__(self, folder: Path):
        """Open a cache folder written by `prepare`, checked against its meta.json (sizes, checksums):
        a damaged one raises CorpusError."""
        self.folder = Path(folder)
        self.meta = read_meta(self.folder)
        try:
            self.tokenizer = Tokenizer.load(self.folder / TOKENIZER_FILE)
        except Exception as e:  # noqa: BLE001 - whatever the tokenizer library raises, the entry is damaged
            raise CorpusError(f"token cache {self.folder}: its tokenizer is damaged ({e})") from None
        if self.tokenizer.vocab_size != self.meta["vocab_size"]:
            raise CorpusError(f"token cache {self.folder}: tokenizer and meta.json disagree on the vocabulary")
        dtype = np.dtype(self.meta["dtype"])
        self.splits = {
            s: np.memmap(self.folder / f"{s}.bin", dtype=dtype, mode="r", shape=(self.meta[s]["tokens"],))
            if self.meta[s]["tokens"] else np.zeros(0, dtype)
            for s in ("train", "val")
        }

    def tokens(self, split: str) -> np.ndarray:
        return self.splits[split]

    def chars_per_token(self, split: str) -> float:
        """Characters per token, to turn a loss per token into a loss per character."""
        return self.meta[split]["chars"] / max(1, self.meta[split]["tokens"])

    def chars(self, split: str, starts: torch.Tensor, context: int) -> int:
        """Characters that the targets of the windows at these starts spell (an end-of-text token spells
        none): their summed loss over this is the loss in nats per character of exactly that text."""
        ids = self.splits[split][starts.numpy()[:, None] + np.arange(1, context + 1)]
        eos = self.tokenizer.eos_id
        return sum(len(self.tokenizer.decode([int(i) for i in row if i != eos])) for row in ids)

    def check_context(self, context: int) -> None:
        for s, arr in self.splits.items():
            if len(arr) < context + 1:
                raise CorpusError(
                    f"the {s} split has {len(arr)} tokens, fewer than one context window of {context + 1} "
                    f"(use a longer corpus or a smaller model.context)"
                )

    def batch(self, split: str, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows at the given start offsets: inputs x (B, T) and targets y, the next token at each place."""
        idx = starts.numpy()[:, None] + np.arange(context + 1)
        w = torch.from_numpy(self.splits[split][idx].astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def random_starts(self, split: str, context: int, count: int, generator: torch.Generator) -> torch.Tensor:
        """count uniformly random window offsets, drawn from generator (the data position)."""
        return torch.randint(len(self.splits[split]) - context, (count,), generator=generator)

    def even_starts(self, split: str, context: int, count: int) -> torch.Tensor:
        """count window offsets spread evenly over the split: a fixed, deterministic evaluation set."""
        last = len(self.splits[split]) - context - 1
        return torch.linspace(0, last, min(count, last + 1)).round().long().unique()  # at most every offset once


def read_meta(folder: Path) -> dict:
    """A cache folder's meta.json, checked against the token files beside it (size and sha256)."""
    try:
        meta = read_json(folder / "meta.json", "token cache", CorpusError)
        dtype = np.dtype(meta["dtype"])
        if dtype not in (np.uint16, np.uint32) or not isinstance(meta["vocab_size"], int):
            raise ValueError("dtype/vocab_size")
        for s in ("train", "val"):
            tokens, digest = meta[s]["tokens"], meta[s]["sha256"]
            if not isinstance(tokens, int) or tokens < 0 or not isinstance(meta[s]["chars"], int):
                raise ValueError(s)
            path = folder / f"{s}.bin"
            if path.stat().st_size != tokens * dtype.itemsize or sha256_of(path) != digest:
                raise ValueError(f"{s}.bin")
        for name, digest in meta["tokenizer_files"].items():  # tokenizer.json (and its settings file)
            if "/" in name or sha256_of(folder / name) != digest:
                raise ValueError(name)
    except (LumenError, OSError, ValueError, KeyError, TypeError) as e:
        raise CorpusError(f"token cache {folder} is damaged ({type(e).__name__}: {e})") from None
    return meta


def prepare(
    corpus: str | list[str] = "shakespeare",
    tokenizer: str = "char",
    vocab_size: int = 2048,
    validation: list[str] | tuple[str, ...] | None = None,
    val_fraction: float = 0.1,
    cache: str | Path | None = None,
    quiet: bool = True,
) -> TokenData:
    """Tokenize a corpus once into the cache (or reuse what is there) and memory-map it.

    For "shakespeare" without an explicit `validation` list the five works of SHAKESPEARE_VALIDATION
    are held out."""
    docs = read_corpus(corpus)
    if validation is None and corpus in ("shakespeare", ["shakespeare"]):
        validation = SHAKESPEARE_VALIDATION
    tok_id = tokenizer
    if tokenizer not in TOKENIZERS and Path(tokenizer).is_file():
        tok_id = hashlib.sha256(Path(tokenizer).read_bytes()).hexdigest()
    h = hashlib.sha256()
    for d in docs:
        h.update(d.name.encode() + b"\0" + hashlib.sha256(d.text.encode()).digest())
    settings: dict[str, object] = dict(tokenizer=tok_id, vocab_size=vocab_size if tokenizer == "bpe" else None,
                    validation=list(validation or []), val_fraction=val_fraction, version=FORMAT_VERSION)
    h.update(json.dumps(settings, sort_keys=True).encode())
    folder = Path(cache or cache_dir("data")) / h.hexdigest()[:16]
    if folder.exists():
        try:
            return TokenData(folder)
        except CorpusError as e:  # never used: rebuilt below
            print(f"lumen: {e}; rebuilding it", file=sys.stderr)
    train, val = split_documents(docs, validation, val_fraction)
    if not quiet:
        print(f"lumen: tokenizing {sum(len(d.text) for d in docs):,} characters ({tokenizer}) into {folder}")
    tok = make_tokenizer(tokenizer, train, docs, vocab_size)
    with atomic_dir(folder) as tmp:
        meta = dict(settings, corpus=corpus, vocab_size=tok.vocab_size, train_documents=[d.name for d in train],
                    val_documents=[d.name for d in val])
        for name, part in (("train", train), ("val", val)):
            ids = encode(tok, part)
            ids.tofile(tmp / f"{name}.bin")
            meta[name] = {"tokens": int(len(ids)), "chars": sum(len(d.text) for d in part),
                          "sha256": sha256_of(tmp / f"{name}.bin")}
            meta["dtype"] = ids.dtype.name
        tok.save(tmp)
        meta["tokenizer_files"] = {f.name: sha256_of(f) for f in sorted(tmp.iterdir()) if f.suffix != ".bin"}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    try:
        return TokenData(folder)
    except CorpusError:  # another process replacing the same folder this very moment (torchrun's ranks)
        time.sleep(0.5)
        return TokenData(folder)
