"""`lumen heads MODEL [--out DIR] [--json]`: previous-token, first-token and induction scores of every
attention head, by layer (see lumen.inspect.heads)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import UserError
from .models import add_model_argument, add_text_arguments, load_with_tokenizer, read_windows


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="attention-head scores: previous-token, first-token, induction")
    add_model_argument(p)
    add_text_arguments(p, seq_len=64, windows=4)
    p.add_argument("--half", type=int, default=32, help="length of the random sequence that is repeated (default 32)")
    p.add_argument("--threshold", type=float, default=0.4, help="a head 'is' of a kind above this score")
    p.add_argument("--out", metavar="DIR", help="write heads.png and heads.json here")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.heads import head_scores, summarize

    if args.windows < 1 or args.seq_len < 3 or args.half < 2:
        raise UserError("--windows must be at least 1, --seq-len at least 3 and --half at least 2")
    model, tok = load_with_tokenizer(args.model)
    text = read_windows(model, tok, args, "val", args.windows, args.seed)
    scores = head_scores(model, text, half=args.half, seed=args.seed)
    summary = summarize(scores, args.threshold)
    data = {"model": model.cfg.name, "scores": {k: v.tolist() for k, v in scores.items()}, "summary": summary}
    if args.out:
        from ..files import write_text
        from ..report.figures import head_scores_plot

        out = Path(args.out)
        write_text(out / "heads.json", json.dumps(data))
        head_scores_plot(scores, out / "heads.png", title=f"{model.cfg.name}: attention heads by layer")
    if args.json:
        print(json.dumps(data))
        return 0
    L, H = scores["induction"].shape
    print(f"{model.cfg.name}: {L} layers x {H} heads; mean attention weight on the key of each kind")
    for name, s in summary.items():
        depth = s["mean_depth_above"]
        where = f"mean relative depth {depth:.2f}" if depth is not None else "none"
        print(f"\n{name}: {len(s['heads_above'])} heads above {args.threshold} ({where}); strongest:")
        for layer, head, v in s["top"]:
            print(f"  layer {layer:>3} head {head:>3}  {v:.3f}")
    print("\nper layer, the largest score of any head:")
    print(f"{'layer':>6}" + "".join(f"{n:>16}" for n in scores))
    for layer in range(L):
        print(f"{layer:>6}" + "".join(f"{float(s[layer].max()):>16.3f}" for s in scores.values()))
    return 0
