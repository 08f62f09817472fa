"""`lumen features MODEL --sae DICT [--feature I]`: a sparse dictionary (SAE or transcoder, SAELens's folder
format, local or hf:ORG/NAME/FOLDER) on a model. Without --feature: how good it is on held-out text (fraction of
variance unexplained, L0, dead features, the next-token loss it recovers). With --feature: that feature's top
contexts (the token it fires on marked [[like this]]) and the tokens its decoder row promotes and suppresses."""

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
    p = sub.add_parser(name, help="a sparse dictionary's features: its quality, or one feature's contexts and logits")
    add_model_argument(p)
    p.add_argument("--sae", required=True, metavar="DICT",
                   help="a SAELens folder (cfg.json + sae_weights.safetensors) or hf:ORG/NAME/FOLDER")
    p.add_argument("--feature", type=int, help="one feature (default: measure the whole dictionary)")
    add_text_arguments(p, seq_len=64, windows=32)
    p.add_argument("--contexts", type=int, default=8, help="top-activating contexts shown for --feature")
    p.add_argument("--tokens", type=int, default=8, help="promoted and suppressed tokens shown for --feature")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_quiet_argument(p)
    return p


def run(args: argparse.Namespace) -> int:
    from ..features import read_saelens
    from ..features.quality import quality
    from ..features.splice import check_fits
    from ..features.tools import check_feature, feature_logits, top_contexts, writes_stream
    from ..inspect.neurons import shifted_tokens

    at_least(args, "windows", "contexts", "tokens")
    at_least(args, "seq_len", least=2)
    sae = read_saelens(args.sae)                      # the small file first: a bad one fails before the model loads
    if args.feature is not None:
        check_feature(sae, args.feature)
    check_corpus(args.corpus)                         # a missing corpus before the model loads
    model, tok = load_with_tokenizer(args.model)
    check_fits(model, sae)
    if args.feature is None:
        q = quality(model, sae, read_windows(model, tok, args, "val", args.windows, args.seed))
        if args.json:
            print(json.dumps({"site": sae.site, "d_sae": sae.d_sae, **q.to_dict()}))
            return 0
        print(f"{sae.d_sae:,} features on {sae.site} ({type(sae.act).__name__}), {q.tokens:,} tokens of {args.corpus}")
        print(f"  fraction of variance unexplained {q.fvu:.3f}   L0 {q.l0:.1f}   dead {q.dead:.1%}")
        print(f"  next-token loss: model {q.loss:.3f}, spliced {q.loss_spliced:.3f}, site zeroed {q.loss_zeroed:.3f}"
              f" -> {q.ce_recovered:.1%} recovered")
        print(f"  error |x - x_hat| {q.error_norm:.3g} per token, beside |x| {q.site_norm:.3g}")
        return 0
    windows = read_windows(model, tok, args, "train", args.windows, args.seed)
    found = top_contexts(model, sae, tok, windows, args.feature, args.contexts)
    shifts = (shifted_tokens(tok, feature_logits(model, sae, args.feature), args.tokens) if writes_stream(sae)
              else {"promoted": [], "suppressed": []})
    up, down = shifts["promoted"], shifts["suppressed"]
    if args.json:
        print(json.dumps({"site": sae.site, "feature": args.feature, "promoted": up, "suppressed": down,
                          "contexts": [{"activation": c.activation, "marked": c.marked()} for c in found]},
                         ensure_ascii=False))
        return 0
    print(f"feature {args.feature} of {sae.site}, {windows.numel():,} tokens of {args.corpus}")
    for c in found:
        print(f"  {c.activation:7.2f}  {c.marked()}")
    if up:
        print("  promotes:   " + "  ".join(quoted(t) for t, _ in up))
        print("  suppresses: " + "  ".join(quoted(t) for t, _ in down))
    return 0
