"""`lumen delete-layer MODEL [--corpus shakespeare] [--out DIR] [--json]`: the held-out loss with each
block skipped in turn, as a table and (with --out) a bar chart."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import UserError
from .models import add_model_argument, add_text_arguments, load_with_tokenizer, read_windows


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="loss on held-out text with each block deleted in turn")
    add_model_argument(p)
    add_text_arguments(p, seq_len=128, windows=8)
    p.add_argument("--layers", help="comma-separated block indices to delete (default: every block)")
    p.add_argument("--out", metavar="DIR", help="write deletion.png and deletion.json here")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.ablate import deletion_table

    if args.windows < 1 or args.seq_len < 2:
        raise UserError("--windows must be at least 1 and --seq-len at least 2")
    try:
        layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    except ValueError:
        raise UserError(f"--layers must be comma-separated integers, got {args.layers!r}") from None
    model, tok = load_with_tokenizer(args.model)
    windows = read_windows(model, tok, args, "val", args.windows, args.seed)
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
