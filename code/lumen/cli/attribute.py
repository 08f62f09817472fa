"""`lumen attribute MODEL --prompt P [--target TOK | --contrast A B] [--position N] [--out DIR] [--json]`:
which writes into the residual stream made a logit (direct logit attribution, lumen.inspect.attribution).

Prints the logit, each block's attention and MLP contribution, and the largest single components (heads
included); --out writes attribution.json and attribution.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import names
from . import UserError
from .models import add_model_argument, add_out_argument, at_least, load_with_tokenizer, output_dir


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="direct logit attribution: each block's and head's share of a logit")
    add_model_argument(p)
    p.add_argument("--prompt", required=True, help="the text to read")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--target", metavar="TOK", help="the token whose logit to split (default: the model's "
                       "own prediction at each position)")
    which.add_argument("--contrast", nargs=2, metavar=("A", "B"),
                       help="split logit[A] - logit[B], e.g. ' Paris' ' Rome'")
    p.add_argument("--position", type=int, default=-1, help="the position to print (default -1, the last)")
    p.add_argument("--top", type=int, default=10, help="how many of the largest components to list (default 10)")
    add_out_argument(p, "write attribution.json and attribution.png here")
    p.add_argument("--json", action="store_true", help="print JSON (every position) instead of the table")
    return p


def targets(tok, target: str | None, contrast: list[str] | None) -> dict:
    """attribute()'s target/contrast keywords from the command line's token texts."""
    from ..inspect.attribution import single_token

    if contrast:
        return {"contrast": tuple(single_token(tok, c, "--contrast") for c in contrast)}
    if target is not None:
        return {"target": single_token(tok, target, "--target")}
    return {}


def run(args: argparse.Namespace) -> int:
    from ..inspect.attribution import attribute, top_components

    at_least(args, "top")
    if args.out is not None:
        output_dir(args.out)
    model, tok = load_with_tokenizer(args.model)
    ids = tok.encode(args.prompt)
    if not ids:
        raise UserError("--prompt is empty: give some text")
    if not -len(ids) <= args.position < len(ids):
        raise UserError(f"--position {args.position} is outside the prompt's {len(ids)} tokens")
    a = attribute(model.eval(), ids, tokenizer=tok, **targets(tok, args.target, args.contrast))
    data = a.to_dict(lambda i: tok.decode([i]))
    if args.out:
        from ..files import write_text
        from ..report.figures import attribution_plot

        out = Path(args.out)
        write_text(out / "attribution.json", json.dumps(data, ensure_ascii=False))
        attribution_plot(a, out / "attribution.png", args.position, title=f"{model.cfg.name}: {args.prompt!r}")
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return 0
    t = args.position % len(ids)
    what = (f"logit[{data['target'][t]!r}] - logit[{data['minus'][t]!r}]" if a.minus is not None
            else f"logit[{data['target'][t]!r}]")
    print(f"{what} at position {t} ({a.tokens[t]!r}) = {float(a.logit[t]):.4f}; "
          f"the components sum to {float(a.values[:, t].sum()):.4f}")
    for name in a.components:
        if not name.startswith("blocks."):
            print(f"{name:>12} {float(a.row(name)[t]):>+9.4f}")
    print(f"{'block':>12} {'attention':>9} {'mlp':>9}  strongest head")
    for i in range(a.heads.size(0)):
        h = int(a.heads[i, :, t].abs().argmax())
        attn, mlp = float(a.row(names.write(i, "attn"))[t]), float(a.row(names.write(i, "mlp"))[t])
        print(f"{i:>12} {attn:>+9.4f} {mlp:>+9.4f}"
              f"  head {h} {float(a.heads[i, h, t]):+.4f}")
    print(f"\nthe {args.top} largest components:")
    for name, v in top_components(a, t, args.top):
        print(f"  {names.display(name):<22} {v:+.4f}")
    if args.out:
        print(f"wrote {args.out}/attribution.json, attribution.png")
    return 0
