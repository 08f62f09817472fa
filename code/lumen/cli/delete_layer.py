"""`lumen delete-layer MODEL [--corpus shakespeare] [--out DIR] [--json]`: the held-out loss with each
block skipped in turn, as a table and (with --out) a bar chart."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import UserError
from .models import load_with_tokenizer


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="loss on held-out text with each block deleted in turn")
    p.add_argument("model", help="smollm2, a .gguf file, a Hugging Face directory or a lumen run directory")
    p.add_argument("--corpus", default="shakespeare", help="text files/directories, or shakespeare (default)")
    p.add_argument("--windows", type=int, default=8, help="held-out windows (default 8)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per window (default 128)")
    p.add_argument("--layers", help="comma-separated block indices to delete (default: every block)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="DIR", help="write deletion.png and deletion.json here")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.ablate import deletion_table
    from ..inspect.corpus import token_windows

    if args.windows < 1 or args.seq_len < 2:
        raise UserError("--windows must be at least 1 and --seq-len at least 2")
    try:
        layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    except ValueError:
        raise UserError(f"--layers must be comma-separated integers, got {args.layers!r}") from None
    model, tok = load_with_tokenizer(args.model)
    if args.seq_len > model.cfg.context:
        raise UserError(f"--seq-len {args.seq_len} exceeds the model's context of {model.cfg.context}")
    windows = token_windows(tok, args.corpus, "val", args.windows, args.seq_len, args.seed)
    table = deletion_table(model, windows, layers)
    table["model"] = model.cfg.name
    if args.out:
        from ..files import write_text
        from ..report.figures import deletion_bars

        out = Path(args.out)
        write_text(out / "deletion.json", json.dumps(table, indent=1))
        deletion_bars(table, out / "deletion.png", title=f"{model.cfg.name}: deleting one block")
    if args.json:
        print(json.dumps(table))
        return 0
    print(f"{model.cfg.name}: held-out loss {table['baseline']:.4f} nats/token over {table['tokens']} tokens")
    print(f"{'deleted':>8}{'loss':>10}{'change':>10}")
    for r in table["rows"]:
        print(f"{r['layer']:>8}{r['loss']:>10.4f}{r['delta']:>+10.4f}")
    return 0
