"""The tokenizers: characters, bytes, and byte-level BPE (trained on a corpus or a pretrained model's), behind
one small interface (Tokenizer); every one saves to and loads from one `tokenizer.json`. single_token: the id
of a text that must be one token.

    >>> tok = CharTokenizer.from_text("hello world")
    >>> tok("hello"), tok.decode(tok.encode("hello"))      # calling a tokenizer encodes
    ([3, 2, 4, 4, 5], 'hello')
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as _HF
from tokenizers import decoders, models, pre_tokenizers, trainers

from ..errors import MissingFileError, ModelFileError, UserError
from ..files import read_json
from .batch import Batch, pad
from .chat import ChatTemplate
from .shown import token_texts

FILENAME = "tokenizer.json"
SETTINGS = "tokenizer_config.json"  # beside a Hugging Face tokenizer.json: eos token, chat template


class Tokenizer:
    """text <-> token ids. Subclasses set `kind` and implement encode/decode/_state.

        >>> tok = ByteTokenizer()
        >>> tok("hi"), tok.encode("hi"), tok.decode([104, 105])
        ([104, 105], [104, 105], 'hi')
    """

    kind = "base"
    eos_id: int | None = None

    def __call__(self, text: str) -> list[int]:
        """The token ids of text: the same as `encode` (tokenizers are called like this elsewhere too)."""
        return self.encode(text)

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def _state(self) -> dict:
        raise NotImplementedError

    @classmethod
    def _from_state(cls, state: dict, path: Path | str = FILENAME) -> Tokenizer:
        raise NotImplementedError

    def str_tokens(self, text: str | Iterable[int]) -> list[str]:
        """Each token of text (or of a list of ids) as its own text: what tables and figures show."""
        ids = self.encode(text) if isinstance(text, str) else list(text)
        return token_texts(self, ids)

    def single_token(self, text: str, what: str = "token") -> int:
        """The id of text if it is exactly one token, else a clear error naming `what` (e.g. "--answer")."""
        return single_token(self, text, what)

    def pad(self, texts: Sequence[str], side: str = "left") -> Batch:
        """Prompts of different lengths as one padded batch (see `Batch`); padding with the end-of-text
        token (id 0 without one): which id it is does not matter, the mask hides it."""
        return pad([self.encode(t) for t in texts], side, self.eos_id or 0, what="text")

    def save(self, directory: str | Path) -> Path:
        """Write `tokenizer.json` into directory; returns its path."""
        path = Path(directory) / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"lumen_tokenizer": self.kind, **self._state()}, ensure_ascii=False))
        return path

    @staticmethod
    def load(path: str | Path) -> Tokenizer:
        """Read a tokenizer saved by `save` (a directory or the json file itself), or any Hugging
        Face `tokenizer.json` (with the eos token and chat template of a tokenizer_config.json beside it)."""
        path = Path(path)
        if path.is_dir():
            path = path / FILENAME
        if not path.is_file():
            raise MissingFileError(f"no tokenizer at {path} (expected a {FILENAME} saved by lumen)")
        state = read_json(path, "tokenizer")
        kind = state.pop("lumen_tokenizer", "hf")
        if not isinstance(kind, str) or kind not in _KINDS:
            raise ModelFileError(f"{path}: unknown tokenizer kind {kind!r}; known: {', '.join(_KINDS)}")
        if kind != "hf":
            return _KINDS[kind]._from_state(state, path)
        tok = HFTokenizer._from_state(read_json(path, "tokenizer"), path)
        if (path.parent / SETTINGS).is_file():
            tok.read_settings(path.parent / SETTINGS)
        return tok

    # whether the model's vocabulary may be larger than the tokenizer's: a Hugging Face tokenizer decodes an id
    # it lacks as nothing (padded embedding tables are common); characters and bytes have no such ids
    pads = False

    def check_fits(self, vocab_size: int, source: str) -> None:
        """Refuse a tokenizer that can produce ids the model has no embedding for, and (for the kinds that cannot
        pad) a model that can produce ids the tokenizer has no text for."""
        if self.vocab_size > vocab_size:
            raise ModelFileError(
                f"{source}: the tokenizer has {self.vocab_size:,} token ids but the model's vocabulary holds "
                f"{vocab_size:,}; the tokenizer belongs to another model (use the one it was trained with)"
            )
        if vocab_size > self.vocab_size and not self.pads:
            raise ModelFileError(
                f"{source}: the model's vocabulary holds {vocab_size:,} ids but this {self.kind} tokenizer has text "
                f"for {self.vocab_size:,}: ids {self.vocab_size:,}..{vocab_size - 1:,} the model can write decode to "
                "nothing; the tokenizer belongs to another model (use the one it was trained with)"
            )


def single_token(tokenizer: Tokenizer, text: str, what: str) -> int:
    """The id of text if it is exactly one token of this tokenizer, else a clear error."""
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise UserError(f"{what} {text!r} is {len(ids)} tokens {pieces}, not one: give a single token "
                        "(often with its leading space, e.g. ' Paris')")
    return ids[0]


def _not_text(text: str) -> UserError:
    """The error for a string UTF-8 cannot encode: it holds half of a UTF-16 surrogate pair (JSON's "\\ud800",
    or bytes that were not UTF-8 read with surrogateescape)."""
    i = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
    if i is None:
        return UserError(f"the text {text[:40]!r} cannot be encoded as UTF-8")
    return UserError(f"character {text[i]!r} (position {i}) is half of a UTF-16 surrogate pair, not text: "
                     "write the character itself (or both halves of its pair)")


def _ids(ids: Iterable[int]) -> list[int]:
    """Token ids as a list of non-negative ints (a negative one would index from the end)."""
    ids = [int(i) for i in ids]
    if any(i < 0 for i in ids):
        raise UserError(f"token ids must not be negative, got {min(ids)}")
    return ids


class CharTokenizer(Tokenizer):
    """One token per distinct character of the training text (nanoGPT's shakespeare_char)."""

    kind = "char"

    def __init__(self, chars: Sequence[str]):
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[c] for c in text]
        except KeyError as e:
            raise UserError(f"character {e.args[0]!r} is not in this character vocabulary") from None

    def decode(self, ids: Iterable[int]) -> str:
        ids = _ids(ids)
        try:
            return "".join(self.chars[i] for i in ids)
        except IndexError:
            raise UserError(f"token ids must lie in [0, {len(self.chars)}) for this character vocabulary, got "
                            f"{max(ids)}") from None

    def _state(self) -> dict:
        return {"chars": "".join(self.chars)}

    @classmethod
    def _from_state(cls, state: dict, path: Path | str = FILENAME) -> CharTokenizer:
        chars = state.get("chars")
        if not isinstance(chars, str) or not chars or len(set(chars)) != len(chars):
            raise ModelFileError(f"{path}: 'chars' must be a non-empty string of distinct characters, got "
                                 f"{str(chars)[:40]!r}; the file is damaged (save the tokenizer again)")
        return cls(list(chars))


class ByteTokenizer(Tokenizer):
    """The 256 byte values of the UTF-8 encoding: any text, no training."""

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise _not_text(text) from None

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        if any(not 0 <= i < 256 for i in ids):
            raise UserError(f"byte token ids must lie in [0, 256), got {max(ids, key=lambda i: abs(i - 128))}")
        return bytes(ids).decode("utf-8", errors="replace")

    def _state(self) -> dict:
        return {}

    @classmethod
    def _from_state(cls, state: dict, path: Path | str = FILENAME) -> ByteTokenizer:
        return cls()


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers.Tokenizer`: a BPE trained here or a pretrained model's."""

    kind = "hf"
    pads = True

    def __init__(self, tok, eos_token: str | None = None):  # tok: tokenizers.Tokenizer
        self.tok = tok
        self.eos_id = tok.token_to_id(eos_token) if eos_token else None
        self.chat: ChatTemplate | None = None

    @property
    def chat_template(self) -> str | None:
        """The chat template's Jinja source (None: the model has none); setting it compiles it (ChatTemplate)."""
        return self.chat.source if self.chat is not None else None

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        self.chat = ChatTemplate(source) if source else None

    @property
    def vocab_size(self) -> int:
        """The number of ids: one more than the largest (a vocabulary with gaps still needs every row)."""
        return max(self.tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def encode(self, text: str) -> list[int]:
        try:
            return self.tok.encode(text, add_special_tokens=False).ids
        except TypeError:   # the Rust side takes only text that UTF-8 can encode
            if not isinstance(text, str):
                raise
            raise _not_text(text) from None

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def save(self, directory: str | Path) -> Path:
        """tokenizer.json, and tokenizer_config.json with the end-of-sequence token and the chat
        template: Hugging Face's own pair of files, readable by `tokenizers` and transformers."""
        path = Path(directory) / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tok.save(str(path))
        eos = self.tok.id_to_token(self.eos_id) if self.eos_id is not None else None
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "add_bos_token": False,
                    "clean_up_tokenization_spaces": False}
        if self.chat_template:
            settings["chat_template"] = self.chat_template
        (path.parent / SETTINGS).write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
        return path

    def read_settings(self, path: Path) -> None:
        """The end-of-sequence token and chat template of a tokenizer_config.json."""
        settings = read_json(path, "tokenizer settings")
        eos = settings.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        template = settings.get("chat_template")
        if not isinstance(eos, (str, type(None))) or not isinstance(template, (str, type(None))):
            raise ModelFileError(f"{path}: eos_token and chat_template must be strings, got {eos!r} and "
                                 f"{str(template)[:40]!r}; fix the file or fetch it again")
        self.eos_id = self.tok.token_to_id(eos) if eos else None
        try:
            self.chat_template = template
        except ModelFileError as e:
            raise ModelFileError(f"{path}: {e}") from None

    @classmethod
    def _from_state(cls, state: dict, path: Path | str = FILENAME) -> HFTokenizer:
        try:
            tok = _HF.from_str(json.dumps(state))
        except Exception as e:  # the tokenizers library raises a bare Exception for any malformed part
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise ModelFileError(f"{path} is not a valid tokenizer ({reason}); save or fetch it again") from None
        return cls(tok, EOS if tok.token_to_id(EOS) is not None else None)


EOS = "<|endoftext|>"  # the document separator of the BPE tokenizers trained here (GPT-2's name for it)


def train_bpe(texts: Iterable[str], vocab_size: int = 2048) -> HFTokenizer:
    """A byte-level BPE (GPT-2's scheme) learned from texts with Hugging Face `tokenizers`: the 256
    byte values, the end-of-text token, then the most frequent merges until vocab_size.

        >>> tok = train_bpe(["to be or not to be"] * 10, vocab_size=300)
        >>> tok.decode(tok.encode("to be"))
        'to be'
    """
    if vocab_size < 257:
        raise UserError(f"a byte-level BPE needs vocab_size >= 257 (256 bytes + end-of-text), got {vocab_size}")
    tok = _HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return HFTokenizer(tok, EOS)


_KINDS: dict[str, type[Tokenizer]] = {"char": CharTokenizer, "byte": ByteTokenizer, "hf": HFTokenizer}
