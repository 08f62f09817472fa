"""Tokenizers: characters, bytes, and byte-level BPE (trained on a corpus or a pretrained model's),
behind one small interface. Every tokenizer saves to and loads from one `tokenizer.json`.

    >>> tok = CharTokenizer.from_text("hello world")
    >>> tok("hello")                       # calling a tokenizer encodes, like tok.encode("hello")
    [3, 2, 4, 4, 5]
    >>> tok.decode(tok.encode("hello"))
    'hello'
    >>> tok.str_tokens("hello")            # each token as its own text
    ['h', 'e', 'l', 'l', 'o']
    >>> batch = tok.pad(["hello", "lo"])   # prompts of different lengths, padded on the left
    >>> batch.ids.shape, batch.mask[1].tolist()
    (torch.Size([2, 5]), [False, False, False, True, True])
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer as _HF
from tokenizers import decoders, models, pre_tokenizers, trainers

from .errors import MissingFileError, ModelFileError, UserError
from .files import read_json

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
        return [self.decode([int(i)]) for i in ids]

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


SIDES = ("left", "right")


@dataclass(frozen=True)
class Batch:
    """Prompts of different lengths side by side: ids (B, T), each row's prompt filled up to the
    longest with padding on one side (left: every prompt ends at the last column, the side generation
    needs), and mask (B, T), True at the real tokens. The model reads it as ``model(batch.ids,
    mask=batch.mask)``; lumen.inspect's tools take the Batch itself, and each prompt's results are what
    it gets alone.

        >>> b = pad([[5, 6, 7], [8]], side="right")
        >>> b.ids.tolist(), b.last.tolist(), b.row(1)
        ([[5, 6, 7], [8, 0, 0]], [2, 0], [8])
    """

    ids: torch.Tensor      # (B, T) token ids, padding included
    mask: torch.Tensor     # (B, T) bool: True at a real token
    side: str = "left"

    def __len__(self) -> int:
        return self.ids.size(0)

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) each prompt's number of tokens."""
        return self.mask.sum(-1)

    @property
    def last(self) -> torch.Tensor:
        """(B,) the column of each prompt's last token (where its next-token prediction is read)."""
        cols = torch.arange(self.mask.size(1), device=self.mask.device)
        return torch.where(self.mask, cols, -1).max(-1).values

    def row(self, b: int) -> list[int]:
        """Prompt b's own token ids, without its padding."""
        return self.ids[b][self.mask[b]].tolist()

    def rows(self) -> list[list[int]]:
        return [self.row(b) for b in range(len(self))]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.ids.to(device), self.mask.to(device), self.side)


def pad(seqs: Sequence[Sequence[int]], side: str = "left", pad_id: int = 0, what: str = "prompt") -> Batch:
    """Token-id lists of different lengths as one `Batch`, padded on `side` ("left" or "right") with pad_id."""
    if side not in SIDES:
        raise UserError(f"padding side must be left or right, got {side!r}")
    if not seqs:
        raise UserError(f"no {what}s to pad: give at least one")
    empty = [i for i, s in enumerate(seqs) if len(s) == 0]
    if empty:
        raise UserError(f"{what} {empty[0]} of {len(seqs)} is empty (no tokens): give every prompt some text")
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, s in enumerate(seqs):
        cols = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        ids[b, cols] = torch.as_tensor(list(s), dtype=torch.long)
        mask[b, cols] = True
    return Batch(ids, mask, side)


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


class ChatTemplate:
    """A model's chat template: Jinja, compiled when the tokenizer is read (a template that is not valid Jinja is
    refused then, naming its line) and rendered in Jinja's immutable sandbox with bounds, since it is code from a
    model file: at most MAX_CHAT_STEPS lines of template run per render (nested loops cannot hang), no string or
    list repeated, padded or formatted past MAX_CHAT_CHARS, no power past MAX_CHAT_EXPONENT. `raise_exception`
    (Hugging Face's helper) is there for templates that refuse a conversation.

        >>> ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}").render("hi")
        '<user>hi'
    """

    def __init__(self, source: str):
        from jinja2 import TemplateSyntaxError

        self.source = source
        try:
            self.template = _chat_environment().from_string(source)
        except TemplateSyntaxError as e:
            raise ModelFileError(f"the chat template is not valid Jinja (line {e.lineno}: {e.message}); "
                                 "use a model file with a working template, or drop --chat") from None

    def render(self, user_text: str, add_generation_prompt: bool = True) -> str:
        """The template applied to one user message, ready for the model's reply."""
        import sys

        from jinja2 import TemplateError

        steps = 0

        def count(frame, event, arg):  # every line the template's own code runs counts one step
            nonlocal steps
            if event == "line":
                steps += 1
                if steps > MAX_CHAT_STEPS:
                    raise _ChatBound(f"it ran more than {MAX_CHAT_STEPS:,} steps")
            return count

        def on_call(frame, event, arg):
            return count if frame.f_code.co_filename == "<template>" else None

        before = sys.gettrace()
        sys.settrace(on_call)
        try:
            text = self.template.render(messages=[{"role": "user", "content": user_text}],
                                        add_generation_prompt=add_generation_prompt)
        except _ChatRefusal as e:
            raise UserError(f"the model's chat template refuses this prompt: {e}") from None
        except _ChatBound as e:
            raise ModelFileError(f"the model's chat template asks for too much ({e}); drop --chat and write the "
                                 "prompt yourself") from None
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, RecursionError,
                MemoryError) as e:  # a template is code from the model file: whatever fails in it is the file's
            raise ModelFileError(f"the model's chat template failed ({type(e).__name__}: {_one_line(e)}); "
                                 "drop --chat and write the prompt yourself") from None
        finally:
            sys.settrace(before)
        if len(text) > MAX_CHAT_CHARS:
            raise ModelFileError(f"the model's chat template made {len(text):,} characters of prompt from "
                                 f"{len(user_text):,}; drop --chat and write the prompt yourself")
        return text


MAX_CHAT_STEPS = 1_000_000    # lines of template code one render may run (SmolLM2's runs a few dozen)
MAX_CHAT_CHARS = 1_000_000    # the longest string or list a template may build
MAX_CHAT_EXPONENT = 1024      # the largest power a template may compute


class _ChatBound(Exception):
    """A chat template went past one of ChatTemplate's bounds."""


class _ChatRefusal(Exception):
    """A chat template called raise_exception."""


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def _chat_environment():
    """Jinja's immutable sandbox with the bounds ChatTemplate describes (built once)."""
    global _CHAT_ENV
    if _CHAT_ENV is not None:
        return _CHAT_ENV
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def big(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CHAT_CHARS

    def check_args(args: tuple, kwargs: dict) -> None:
        if any(big(a) for a in (*args, *kwargs.values())):
            raise _ChatBound(f"a width or count above {MAX_CHAT_CHARS:,}")

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, int) and abs(right) > MAX_CHAT_EXPONENT:
                raise _ChatBound(f"a power above {MAX_CHAT_EXPONENT}")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_CHAT_CHARS:
                        raise _ChatBound(f"a string or list longer than {MAX_CHAT_CHARS:,}")
            if operator == "%" and isinstance(left, str) and re.search(r"\d{7,}", left):
                raise _ChatBound(f"a format wider than {MAX_CHAT_CHARS:,}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
            check_args(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value):  # str.format and format_map: no field wider than the bound
            if isinstance(getattr(value, "__self__", None), str) and re.search(r"\d{7,}", value.__self__):
                raise _ChatBound(f"a format wider than {MAX_CHAT_CHARS:,}")
            return super().wrap_str_format(value)

    def bounded(fn):
        def filter_(*args, **kwargs):
            check_args(args[1:], kwargs)
            return fn(*args, **kwargs)
        for attr in ("jinja_pass_arg",):  # (filters that take the context or environment keep saying so)
            if hasattr(fn, attr):
                setattr(filter_, attr, getattr(fn, attr))
        return filter_

    def raise_exception(message: str = "") -> None:
        raise _ChatRefusal(str(message))

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters = {name: bounded(fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    _CHAT_ENV = env
    return env


_CHAT_ENV = None


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
