"""`lumen attribute MODEL (--prompt P | --prompts FILE) [--target TOK | --contrast A B] [--position N] [--out DIR]
[--json]`: which writes into the residual stream made a logit (direct logit attribution, lumen.inspect.attribution).

Prints the logit, each block's attention and MLP contribution, and the largest single components (heads
included); --out writes attribution.json and attribution.png. With --prompts, every prompt of the file is
split at its last token (its answer from the file, the command line, or its own prediction), one line each,
then the mean of every component over the file, which adds up to the mean logit (lumen.inspect.datasets.
AttributionSet); --out
then writes every prompt's split and the mean (attribution.json, what --json prints) and the mean's figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import names
from ..tokenizers.shown import logit_name, quoted
from . import UserError
from .models import add_model_argument, add_out_argument, at_least, load_with_tokenizer, output_dir
from .prompts import add_prompts_arguments, check_prompts_file, refuse_with_prompts


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="direct logit attribution: each block's and head's share of a logit, on a prompt "
                       "or a file of them")
    add_model_argument(p)
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="the text to read")
    add_prompts_arguments(p, given)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--target", metavar="TOK", help="the token whose logit to split (default: the model's "
                       "own prediction at each position)")
    which.add_argument("--contrast", nargs=2, metavar=("A", "B"),
                       help="split logit[A] - logit[B], e.g. ' Paris' ' Rome'")
    p.add_argument("--position", type=int, default=None, help="the position to print (default -1, the last)")
    p.add_argument("--top", type=int, default=10, help="how many of the largest components to list (default 10)")
    add_out_argument(p, "write attribution.json and attribution.png here (with --prompts: every prompt's and the "
                     "mean's JSON, the mean's figure)")
    p.add_argument("--json", action="store_true", help="print JSON (every position) instead of the table")
    return p


def targets(tok, target: str | None, contrast: list[str] | None) -> dict:
    """attribute()'s target/contrast keywords from the command line's token texts."""
    if contrast:
        return {"contrast": tuple(tok.single_token(c, "--contrast") for c in contrast)}
    if target is not None:
        return {"target": tok.single_token(target, "--target")}
    return {}


def run(args: argparse.Namespace) -> int:
    from ..inspect.attribution import attribute
    from ..inspect.datasets import attribute_prompts
    from ..prompts import read_prompts, with_answers

    at_least(args, "top")
    if args.prompts:
        refuse_with_prompts("--position", args.position is not None)
    position = -1 if args.position is None else args.position
    if args.out is not None:
        output_dir(args.out)
    check_prompts_file(args)
    model, tok = load_with_tokenizer(args.model)
    if args.prompts:
        prompts = read_prompts(args.prompts, tok, model.cfg.context)
        given = targets(tok, args.target, args.contrast)
        if given:
            pair = given.get("contrast", (given.get("target"), None))
            prompts = with_answers(prompts, pair[0], pair[1], args.prompts)
        found = attribute_prompts(model.eval(), prompts, tok, args.batch_size)
        return print_prompts(args, found, tok, model.cfg.name)
    ids = tok.encode(args.prompt)
    if not ids:
        raise UserError("--prompt is empty: give some text")
    if not -len(ids) <= position < len(ids):
        raise UserError(f"--position {position} is outside the prompt's {len(ids)} tokens")
    a = attribute(model.eval(), ids, tokenizer=tok, **targets(tok, args.target, args.contrast))
    data = a.to_dict(lambda i: tok.decode([i]))
    if args.out:
        from ..files import write_text
        from ..report.figures import attribution_plot

        out = Path(args.out)
        write_text(out / "attribution.json", json.dumps(data, ensure_ascii=False))
        attribution_plot(a, out / "attribution.png", position, title=f"{model.cfg.name}: {args.prompt!r}")
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return 0
    t = position % len(ids)
    what = logit_name(data['target'][t], data['minus'][t] if a.minus is not None else None)
    print(f"{what} at position {t} ({quoted(a.tokens[t])}) = {float(a.logit[t]):.4f}; "
          f"the components sum to {float(a.values[:, t].sum()):.4f}")
    print_components(a, t, args.top)
    if args.out:
        print(f"wrote {args.out}/attribution.json, attribution.png")
    return 0


def print_components(a, t: int, top: int) -> None:
    """Position t of an attribution: the embedding and bias rows, each block's attention and MLP, the largest parts."""
    from ..inspect.attribution import top_components

    for name in a.components:
        if not name.startswith("blocks."):
            print(f"{name:>12} {float(a.row(name)[t]):>+9.4f}")
    print(f"{'block':>12} {'attention':>9} {'mlp':>9}  strongest head")
    for i in range(a.heads.size(0)):
        h = int(a.heads[i, :, t].abs().argmax())
        attn, mlp = float(a.row(names.write(i, "attn"))[t]), float(a.row(names.write(i, "mlp"))[t])
        print(f"{i:>12} {attn:>+9.4f} {mlp:>+9.4f}"
              f"  head {h} {float(a.heads[i, h, t]):+.4f}")
    print(f"\nthe {top} largest components:")
    for name, v in top_components(a, t, top):
        print(f"  {names.display(name):<22} {v:+.4f}")


def print_prompts(args: argparse.Namespace, found, tok, model_name: str) -> int:
    """A file of prompts' attribution (an AttributionSet): each prompt's line, then the mean of each component."""
    data = {"file": str(args.prompts), **found.to_dict(lambda i: tok.decode([i]))}
    mean, what, n = found.mean, found.what, len(found.results)
    if args.out:
        from ..files import write_text
        from ..report.figures import attribution_plot

        out = Path(args.out)
        write_text(out / "attribution.json", json.dumps(data, ensure_ascii=False))
        attribution_plot(mean, out / "attribution.png", 0, title=f"{model_name}: {what}, mean over {n} prompts")
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return 0
    print(f"direct logit attribution on {n} prompts of {args.prompts}, at each prompt's last token")
    for r in data["prompts"]:
        parts = ", ".join(f"{names.display(c)} {v:+.4f}" for c, v in r["top"][:3])
        print(f"line {r['line']:>4}: {r['what']} = {r['logit']:.4f}; largest: {parts}")
    print(f"\nmean over the {n} prompts: {what} = {float(mean.logit[0]):.4f}; the mean components sum to "
          f"{float(mean.values[:, 0].sum()):.4f}")
    print_components(mean, 0, args.top)
    if args.out:
        print(f"wrote {args.out}/attribution.json (every prompt and the mean), attribution.png (the mean)")
    return 0
