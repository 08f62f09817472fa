"""`lumen eval MODEL --text FILE [--context C] [--json]`: mean next-token loss and perplexity of a text, in nats
per token and per character (the figure training reports, comparable across tokenizers)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from ..errors import CorpusError, MissingFileError
from . import UserError
from .models import DTYPES, add_model_argument, load_model


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="loss (nats per token and per character) and perplexity of a model on a text file")
    add_model_argument(p)
    p.add_argument("--text", required=True, type=Path, help="a UTF-8 text file")
    p.add_argument("--context", type=int, default=None,
                   help="window length in tokens (default: the model's context, at most 2048)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' precision")
    return p


def read_text(path: Path, option: str = "--text") -> str:
    """A UTF-8 text file's contents, or a one-line error saying what is wrong with it."""
    if not path.exists():
        raise MissingFileError(f"{option} {path}: no such file")
    if not path.is_file():
        raise UserError(f"{option} {path} is not a file (give a UTF-8 text file)")
    data = path.read_bytes()
    if b"\0" in data:
        raise CorpusError(f"{option} {path} is a binary file, not text (give a UTF-8 text file)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{option} {path} is not UTF-8 text (byte {e.start}); convert it to UTF-8") from None
    if not text.strip():
        raise CorpusError(f"{option} {path} is empty: give a file with some text")
    return text


def chars_scored(tokenizer, ids: list[int], context: int) -> int:
    """Characters spelled by the tokens `evaluate` scores: every token but the first of each window."""
    from ..evaluate import windows

    return sum(len(tokenizer.decode(ids[s + 1 : e])) for s, e in windows(len(ids), context))


def run(args: argparse.Namespace) -> int:
    from ..evaluate import DEFAULT_CONTEXT, evaluate, windows

    if args.context is not None and args.context < 2:
        raise UserError(f"--context must be at least 2 tokens (one to read, one to predict), got {args.context}")
    text = read_text(args.text)
    loaded = load_model(args.model, args.dtype)
    if loaded.tokenizer is None:
        raise UserError(f"{args.model} has no tokenizer to read {args.text} (save one with the model)")
    model, ids = loaded.model, loaded.tokenizer.encode(text)
    if args.context is not None and args.context > model.cfg.context:
        raise UserError(f"--context {args.context} exceeds the model's context of {model.cfg.context} "
                        "(give a smaller --context)")
    r = evaluate(model, ids, args.context)
    if not math.isfinite(r.loss):  # checked once, on the result: then where the forward pass went non-finite
        from ..inspect.finite import non_finite_error

        context = args.context or min(model.cfg.context, DEFAULT_CONTEXT)
        batches = (torch.tensor([ids[s:e]]) for s, e in windows(len(ids), context))
        raise non_finite_error(model, batches, args.model, "the losses")
    chars = chars_scored(loaded.tokenizer, ids, args.context or min(model.cfg.context, DEFAULT_CONTEXT))
    per_char = r.loss * r.scored / max(1, chars)
    if args.json:
        print(json.dumps({"model": args.model, "text": str(args.text), **r.to_dict(),
                          "loss_per_char": per_char, "chars": chars}, indent=2))
    else:
        print(f"{args.model} on {args.text}: loss {r.loss:.4f} nats/token ({per_char:.4f} nats/character), "
              f"perplexity {r.perplexity:.3f}")
        print(f"  {r.tokens:,} tokens in {r.windows} window(s) of {r.context}; {r.scored:,} predictions scored "
              f"({chars:,} characters)")
    return 0
