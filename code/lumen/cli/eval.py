"""`lumen eval MODEL --text FILE [--context C] [--json]`: mean next-token loss and perplexity of a text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import MissingFileError
from . import UserError
from .models import DTYPES, add_model_argument, load_model


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="loss (nats/token) and perplexity of a model on a text file")
    add_model_argument(p)
    p.add_argument("--text", required=True, type=Path, help="a UTF-8 text file")
    p.add_argument("--context", type=int, default=None,
                   help="window length in tokens (default: the model's context, at most 2048)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' precision (default float32)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..evaluate import evaluate

    if not args.text.is_file():
        raise MissingFileError(f"no text file at {args.text}")
    try:
        text = args.text.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{args.text} is not UTF-8 text (byte {e.start}); convert it to UTF-8") from None
    loaded = load_model(args.model, args.dtype)
    if loaded.tokenizer is None:
        raise UserError(f"{args.model} has no tokenizer to read {args.text} (save one with the model)")
    r = evaluate(loaded.model, loaded.tokenizer.encode(text), args.context)
    if args.json:
        print(json.dumps({"model": args.model, "text": str(args.text), **r.to_dict()}, indent=2))
    else:
        print(f"{args.model} on {args.text}: loss {r.loss:.4f} nats/token, perplexity {r.perplexity:.3f}")
        print(f"  {r.tokens:,} tokens in {r.windows} window(s) of {r.context}; {r.scored:,} predictions scored")
    return 0
