"""`lumen delete-layer MODEL [--corpus shakespeare] [--out DIR] [--json]`: the held-out loss with each
block skipped in turn, as a table and (with --out) a bar chart."""

from __future__ import annotations

import argparse
import json

from . import UserError
from .models import (
    add_model_argument,
    add_out_argument,
    add_quiet_argument,
    add_text_arguments,
    at_least,
    check_corpus,
    load_with_tokenizer,
    output_dir,
    read_windows,
)


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="loss on held-out text with each block deleted in turn")
    add_model_argument(p)
    add_text_arguments(p, seq_len=128, windows=8)
    p.add_argument("--blocks", "--layers", dest="blocks",
                   help="comma-separated block indices to delete (default: every block)")
    add_out_argument(p, "write deletion.png and deletion.json into this folder")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    add_quiet_argument(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.ablate import deletion_table

    at_least(args, "windows")
    at_least(args, "seq_len", least=2)
    out = output_dir(args.out) if args.out else None
    try:
        blocks = [int(x) for x in args.blocks.split(",")] if args.blocks is not None else None
    except ValueError:
        raise UserError(f"--blocks must be comma-separated integers, got {args.blocks!r}") from None
    check_corpus(args.corpus)                         # a missing corpus before the model loads
    model, tok = load_with_tokenizer(args.model)
    windows = read_windows(model, tok, args, "val", args.windows, args.seed)
    table = deletion_table(model, windows, blocks)
    table["model"] = model.cfg.name
    if out:
        from ..files import write_text
        from ..report.figures import deletion_bars

        write_text(out / "deletion.json", json.dumps(table, indent=1))
        deletion_bars(table, out / "deletion.png", title=f"{model.cfg.name}: deleting one block")
    if args.json:
        print(json.dumps(table))
        return 0
    print(f"{model.cfg.name}: held-out loss {table['baseline']:.4f} nats/token over {table['tokens']} tokens")
    print(f"{'deleted':>8}{'loss':>10}{'change':>10}")
    for r in table["rows"]:
        print(f"{'block ' + str(r['block']):>8}{r['loss']:>10.4f}{r['delta']:>+10.4f}")
    return 0
