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

kinds.py: the tokenizers (Tokenizer, CharTokenizer, ByteTokenizer, HFTokenizer, train_bpe) and single_token;
batch.py: Batch and pad (a padded batch of prompts); chat.py: ChatTemplate (a model's chat template, sandboxed);
shown.py: a token as a reader sees it (shown, quoted, logit_name), the one way lumen prints a token.
"""

from __future__ import annotations

from .batch import SIDES, Batch, pad
from .chat import MAX_CHAT_CHARS, MAX_CHAT_EXPONENT, MAX_CHAT_STEPS, ChatTemplate
from .kinds import (
    EOS,
    FILENAME,
    SETTINGS,
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    single_token,
    train_bpe,
)

__all__ = ["EOS", "FILENAME", "MAX_CHAT_CHARS", "MAX_CHAT_EXPONENT", "MAX_CHAT_STEPS", "SETTINGS", "SIDES", "Batch",
           "ByteTokenizer", "CharTokenizer", "ChatTemplate", "HFTokenizer", "Tokenizer", "pad", "single_token",
           "train_bpe"]
