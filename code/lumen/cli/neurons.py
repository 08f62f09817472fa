"""`lumen neurons MODEL --layer L [--unit I]`: MLP units as key-value memories. Without --unit, scans the
layer and lists the units with the clearest triggers; each with its top contexts (trigger token marked
[[like this]]) and the tokens its value vector promotes and suppresses."""

from __future__ import annotations

import argparse
import json

from . import UserError
from .models import add_model_argument, add_text_arguments, load_with_tokenizer, read_windows


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="MLP neurons: top activating contexts and the tokens their values promote")
    add_model_argument(p)
    p.add_argument("--layer", type=int, required=True, help="the block whose MLP to read")
    p.add_argument("--unit", type=int, help="one hidden unit (default: scan the layer)")
    add_text_arguments(p, seq_len=64, windows=64)
    p.add_argument("--top-k", type=int, default=8, help="contexts per unit (default 8)")
    p.add_argument("--show", type=int, default=6, help="units to list when scanning (default 6)")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.cache import check_layer
    from ..inspect.neurons import check_unit, neuron_report, scan_layer, top_activations

    if args.windows < 1 or args.seq_len < 2 or args.top_k < 1 or args.show < 1:
        raise UserError("--windows, --top-k and --show must be at least 1, --seq-len at least 2")
    model, tok = load_with_tokenizer(args.model)
    check_layer(model, args.layer)
    if args.unit is not None:
        check_unit(model, args.layer, args.unit)
    windows = read_windows(model, tok, args, "train", args.windows, args.seed)
    if args.unit is None:
        reports = scan_layer(model, tok, windows, args.layer, args.top_k, args.show)
    else:
        values, positions = top_activations(model, windows, args.layer, args.top_k)
        reports = [neuron_report(model, tok, windows, args.layer, args.unit, values[args.unit], positions[args.unit])]
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], ensure_ascii=False))
        return 0
    print(f"{model.cfg.name} block {args.layer} MLP, {windows.numel()} tokens of {args.corpus}")
    for r in reports:
        print(f"\nunit {r.unit}: max activation {r.top_activation:.2f}; {r.trigger_share:.0%} of top contexts fire on "
              f"{r.common_trigger!r}; next token promoted in {r.agreement:.0%}")
        for c in r.contexts:
            print(f"  {c.activation:7.2f}  {c.marked()}")
        print("  promotes:  " + "  ".join(repr(t) for t, _ in r.promoted))
        print("  suppresses: " + "  ".join(repr(t) for t, _ in r.suppressed))
    return 0
