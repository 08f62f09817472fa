"""`lumen neurons MODEL --block B [--unit I]`: MLP units as key-value memories. Without --unit, scans the
block's MLP and lists the units with the clearest triggers; each with its top contexts (trigger token marked
[[like this]]) and the tokens its value vector promotes and suppresses."""

from __future__ import annotations

import argparse
import json

from ..tokenizers.shown import quoted
from .models import (
    add_model_argument,
    add_quiet_argument,
    add_text_arguments,
    at_least,
    check_corpus,
    load_with_tokenizer,
    read_windows,
)


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="MLP neurons: top activating contexts and the tokens their values promote")
    add_model_argument(p)
    p.add_argument("--block", "--layer", dest="block", type=int, required=True,
                   help="the block whose MLP to read (0 = the first block)")
    p.add_argument("--unit", type=int, help="one hidden unit (default: scan the block's MLP)")
    add_text_arguments(p, seq_len=64, windows=64)
    p.add_argument("--contexts", dest="contexts", type=int, default=8,
                   help="top-activating contexts shown per unit")
    p.add_argument("--top-k", dest="contexts", type=int, help=argparse.SUPPRESS)  # (old name; --top-k samples)
    p.add_argument("--show", type=int, default=6, help="units to list when scanning")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_quiet_argument(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.cache import check_layer
    from ..inspect.neurons import check_unit, neuron_report, scan_layer, top_activations

    at_least(args, "windows", "contexts", "show")
    at_least(args, "seq_len", least=2)
    check_corpus(args.corpus)                         # a missing corpus before the model loads
    model, tok = load_with_tokenizer(args.model)
    check_layer(model, args.block)
    if args.unit is not None:
        check_unit(model, args.block, args.unit)
    windows = read_windows(model, tok, args, "train", args.windows, args.seed)
    if args.unit is None:
        reports = scan_layer(model, tok, windows, args.block, args.contexts, args.show)
    else:
        values, positions = top_activations(model, windows, args.block, args.contexts)
        reports = [neuron_report(model, tok, windows, args.block, args.unit, values[args.unit], positions[args.unit])]
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], ensure_ascii=False))
        return 0
    print(f"{model.cfg.name} block {args.block} MLP, {windows.numel()} tokens of {args.corpus}")
    for r in reports:
        print(f"\nunit {r.unit}: max activation {r.top_activation:.2f}; {r.trigger_share:.0%} of top contexts fire on "
              f"{quoted(r.common_trigger)}; next token promoted in {r.agreement:.0%}")
        for c in r.contexts:
            print(f"  {c.activation:7.2f}  {c.marked()}")
        print("  promotes:  " + "  ".join(quoted(t) for t, _ in r.promoted))
        print("  suppresses: " + "  ".join(quoted(t) for t, _ in r.suppressed))
    return 0
