"""A tiny lumen run to point commands at: a checkpoint with a character tokenizer, and a corpus folder."""

from __future__ import annotations

import torch

from helpers.models import peaked_tiny_model
from lumen import GPT, ModelConfig
from lumen.formats.checkpoint import save_checkpoint
from lumen.tokenizers import CharTokenizer

TEXT = ("ROMEO.\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "Arise, fair sun, and kill the envious moon,\nWho is already sick and pale with grief.\n") * 6
# (clean, corrupt, answer, wrong) pairs of TEXT's characters, of different lengths (so the batches pad)
PAIRS = [("It is the east", "It is the west", "e", "a"), ("Juliet", "Romeo.", " ", "s"),
         ("the sun", "the moo", ".", "n")]


def tiny_run(root):
    """A small lumen checkpoint with a character tokenizer (root/run), and a corpus folder of two texts."""
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, context=64, d_model=32, n_layers=3, n_heads=4, name="tiny-run")
    save_checkpoint(root / "run", GPT(cfg), tokenizer=tok)
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_text(TEXT)
    (root / "corpus" / "b.txt").write_text(TEXT[::-1])  # held out: the last document
    return root


def peaked_run(root):
    """helpers.models' peaked tiny model on TEXT, saved as a lumen checkpoint (root/run)."""
    model, tok = peaked_tiny_model(TEXT)
    save_checkpoint(root / "run", model, tokenizer=tok)
    return root / "run"
