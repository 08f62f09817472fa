"""`lumen patch MODEL --clean P --corrupt Q [--metric logit-diff|logprob] [--answer TOK --wrong TOK]`:
activation patching (lumen.inspect.patching). Copy each site of the clean run into the corrupted one and
print how much of the clean metric comes back (0..1), per block and position; --out writes patching.json
and patching.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import UserError
from .models import add_model_argument, add_out_argument, load_with_tokenizer, output_dir

METRICS = ("logit-diff", "logprob")
KINDS = ("resid_pre", "attn_out", "mlp_out", "head")


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="activation patching: which sites carry the clean prompt's answer")
    add_model_argument(p)
    p.add_argument("--clean", required=True, help="the prompt whose activations are copied")
    p.add_argument("--corrupt", required=True, help="a prompt of the same token length that is patched")
    p.add_argument("--metric", choices=METRICS, default="logit-diff",
                   help="logit-diff: logit[answer] - logit[wrong] (default); logprob: log p(answer)")
    p.add_argument("--answer", metavar="TOK", help="the clean answer (default: the clean prompt's prediction)")
    p.add_argument("--wrong", metavar="TOK", help="the corrupt answer (default: the corrupt prompt's prediction)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="which sites to patch (default all)")
    add_out_argument(p, "write patching.json and patching.png here")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    return p


def answers(model, tok, clean: list[int], corrupt: list[int], answer: str | None, wrong: str | None) -> tuple[int, int]:
    """The two tokens the metric compares: given, or each prompt's own next-token prediction."""
    import torch

    from ..inspect.attribution import single_token

    with torch.no_grad():
        a = single_token(tok, answer, "--answer") if answer else int(model(torch.tensor([clean]))[0][0, -1].argmax())
        b = single_token(tok, wrong, "--wrong") if wrong else int(model(torch.tensor([corrupt]))[0][0, -1].argmax())
    if a == b:
        raise UserError(f"the answer and the wrong token are both {tok.decode([a])!r}: give --answer and --wrong")
    return a, b


def run(args: argparse.Namespace) -> int:
    from ..inspect.patching import logit_diff, logprob, patching_maps

    if args.out is not None:
        output_dir(args.out)
    model, tok = load_with_tokenizer(args.model)
    clean, corrupt = tok.encode(args.clean), tok.encode(args.corrupt)
    if not clean or len(clean) != len(corrupt):
        raise UserError(f"--clean and --corrupt must be non-empty and the same number of tokens: "
                        f"{[tok.decode([i]) for i in clean]} vs {[tok.decode([i]) for i in corrupt]}")
    a, b = answers(model.eval(), tok, clean, corrupt, args.answer, args.wrong)
    metric = logit_diff(a, b) if args.metric == "logit-diff" else logprob(a)
    name = (f"logit[{tok.decode([a])!r}] - logit[{tok.decode([b])!r}]" if args.metric == "logit-diff"
            else f"log p({tok.decode([a])!r})")
    r = patching_maps(model, clean, corrupt, metric, kinds=args.kinds, tokenizer=tok, metric_name=name)
    data = r.to_dict()
    if args.out:
        from ..files import write_text
        from ..report.figures import patching_plot

        out = Path(args.out)
        write_text(out / "patching.json", json.dumps(data, ensure_ascii=False))
        patching_plot(r, out / "patching.png", title=f"{model.cfg.name}: restoring {name}")
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return 0
    print(f"{name}: clean {r.clean_metric:.4f}, corrupt {r.corrupt_metric:.4f}; "
          "each cell: the fraction of the difference a patch restores")
    for kind, m in r.maps.items():
        cols = [f"h{h}" for h in range(m.size(1))] if kind == "head" else r.clean_tokens
        print(f"\n{kind}:")
        print(f"{'block':>6} " + "".join(f"{_clip(c):>9}" for c in cols))
        for i in range(m.size(0)):
            print(f"{i:>6} " + "".join(f"{float(v):>9.2f}" for v in m[i]))
    if args.out:
        print(f"\nwrote {args.out}/patching.json, patching.png")
    return 0


def _clip(text: str, n: int = 8) -> str:
    text = repr(text)[1:-1]
    return text if len(text) <= n else text[: n - 1] + "…"
