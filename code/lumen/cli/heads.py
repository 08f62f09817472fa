"""`lumen heads MODEL [--out DIR] [--json]`: previous-token, first-token and induction scores of every
attention head, by block (see lumen.inspect.heads). Heads are named "block B head H", B and H from 0."""

from __future__ import annotations

import argparse
import json

from .. import names
from .models import (
    add_model_argument,
    add_out_argument,
    add_quiet_argument,
    add_text_arguments,
    at_least,
    check_corpus,
    finite,
    load_with_tokenizer,
    output_dir,
    read_windows,
)


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="attention-head scores: previous-token, first-token, induction")
    add_model_argument(p)
    add_text_arguments(p, seq_len=64, windows=4)
    p.add_argument("--half", type=int, default=32, help="length of the random sequence that is repeated")
    p.add_argument("--threshold", type=finite, default=0.4, help="a head 'is' of a kind above this score")
    add_out_argument(p, "write heads.png and heads.json into this folder")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_quiet_argument(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.heads import head_scores, summarize

    at_least(args, "windows")
    at_least(args, "seq_len", least=3)
    at_least(args, "half", least=2)
    out = output_dir(args.out) if args.out else None
    check_corpus(args.corpus)                         # a missing corpus before the model loads
    model, tok = load_with_tokenizer(args.model)
    text = read_windows(model, tok, args, "val", args.windows, args.seed)
    scores = head_scores(model, text, half=args.half, seed=args.seed)
    summary = summarize(scores, args.threshold)
    data = {"model": model.cfg.name, "scores": {k: v.tolist() for k, v in scores.items()}, "summary": summary}
    if out:
        from ..files import write_text
        from ..report.figures import head_scores_plot

        write_text(out / "heads.json", json.dumps(data))
        head_scores_plot(scores, out / "heads.png", title=f"{model.cfg.name}: attention heads by block")
    if args.json:
        print(json.dumps(data))
        return 0
    L, H = scores["induction"].shape
    print(f"{model.cfg.name}: {L} blocks x {H} heads; mean attention weight on the key of each kind")
    for name, s in summary.items():
        depth = s["mean_depth_above"]
        where = f"mean relative depth {depth:.2f}" if depth is not None else "none"
        print(f"\n{name}: {len(s['heads_above'])} heads above {args.threshold} ({where}); strongest:")
        for block, head, v in s["top"]:
            print(f"  {names.display(names.head(block, head)):<18}  {v:.3f}")
    print("\nper block, the largest score of any head:")
    print(f"{'block':>6}" + "".join(f"{n:>16}" for n in scores))
    for block in range(L):
        print(f"{block:>6}" + "".join(f"{float(s[block].max()):>16.3f}" for s in scores.values()))
    return 0
