"""`lumen patch MODEL (--clean P --corrupt Q | --prompts FILE) [--metric logit-diff|logprob]
[--answer TOK --wrong TOK] [--method exact|attribution|both]`: activation patching (lumen.inspect.patching).
Copy each site of the clean run into the corrupted one and print how much of the clean metric comes back
(0..1), per block and position; --out writes patching.json and patching.png. With --prompts, a JSON-lines file
of pairs: each pair's metric and its most restoring sites, then the maps of the whole dataset (the mean patched
metric against the mean clean and corrupt ones, positions counted from each pair's last token;
lumen.inspect.datasets.patch_prompts, a PatchingSet per method); --out then writes every pair's maps and the
mean ones, and the mean maps' PNG. --method attribution estimates every map from one forward and one backward pass
(lumen.inspect.attribution_patching); both prints the two side by side with Pearson's r per site kind: how far
the cheap estimate can be trusted on these prompts.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..tokenizers.shown import quoted, shown
from . import UserError
from .models import add_model_argument, add_out_argument, load_with_tokenizer, output_dir
from .prompts import add_prompts_arguments, check_prompts_file, refuse_with_prompts

METRICS = ("logit-diff", "logprob")   # (lumen.inspect.datasets.METRICS: the parser is built before it is imported)
KINDS = ("resid_pre", "attn_out", "mlp_out", "head")
METHODS = {"exact": ("exact",), "attribution": ("attribution",), "both": ("exact", "attribution")}
LABELS = {"exact": "exact", "attribution": "attribution estimate"}
PLOTS = {"exact": "patching.png", "attribution": "patching-attribution.png"}
WHAT = {"map": "the map's cells", "mean": "the mean map", "cells": "every pair's cells"}


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="activation patching: which sites carry the clean prompt's answer")
    add_model_argument(p)
    p.add_argument("--clean", help="the prompt whose activations are copied")
    p.add_argument("--corrupt", help="a prompt of the same token length that is patched")
    add_prompts_arguments(p, pairs=True)
    p.add_argument("--metric", choices=METRICS, default="logit-diff",
                   help="logit-diff: logit[answer] - logit[wrong] (default); logprob: log p(answer)")
    p.add_argument("--answer", metavar="TOK", help="the clean answer (default: the clean prompt's prediction)")
    p.add_argument("--wrong", metavar="TOK", help="the corrupt answer (default: the corrupt prompt's prediction)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="which sites to patch (default all)")
    p.add_argument("--method", choices=METHODS, default="exact",
                   help="exact: one patched run per cell (default); attribution: every cell estimated from one "
                   "forward and one backward pass (gradient x activation difference); both: the two side by side, "
                   "with their correlation per site kind")
    add_out_argument(p, "write patching.json and patching.png (the estimate's: patching-attribution.png) here; "
                     "with --prompts, every pair's maps and the mean ones, and the mean maps' PNG")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    return p


def answers(model, tok, clean: list[int], corrupt: list[int], answer: str | None, wrong: str | None) -> tuple[int, int]:
    """The two tokens the metric compares: given, or each prompt's own next-token prediction."""
    import torch

    with torch.no_grad():
        a = tok.single_token(answer, "--answer") if answer else int(model(torch.tensor([clean]))[0][0, -1].argmax())
        b = tok.single_token(wrong, "--wrong") if wrong else int(model(torch.tensor([corrupt]))[0][0, -1].argmax())
    if a == b:
        raise UserError(f"the answer and the wrong token are both {quoted(tok.decode([a]))}: give --answer and --wrong")
    return a, b


def run(args: argparse.Namespace) -> int:
    from ..inspect.datasets import metric_name
    from ..inspect.patching import logit_diff, logprob

    if args.prompts:
        refuse_with_prompts("--clean", args.clean is not None)
        refuse_with_prompts("--corrupt", args.corrupt is not None)
    elif args.clean is None or args.corrupt is None:
        raise UserError("give --clean and --corrupt (a pair of prompts), or --prompts FILE (a dataset of pairs)")
    if args.out is not None:
        output_dir(args.out)
    check_prompts_file(args)
    model, tok = load_with_tokenizer(args.model)
    if args.prompts:
        return run_prompts(args, model.eval(), tok)
    clean, corrupt = tok.encode(args.clean), tok.encode(args.corrupt)
    if not clean or len(clean) != len(corrupt):
        raise UserError(f"--clean and --corrupt must be non-empty and the same number of tokens: "
                        f"{tok.str_tokens(clean)} vs {tok.str_tokens(corrupt)}")
    a, b = answers(model.eval(), tok, clean, corrupt, args.answer, args.wrong)
    metric = logit_diff(a, b) if args.metric == "logit-diff" else logprob(a)
    name = metric_name(tok, args.metric, a, b)
    found = {m: patched(m, model, clean, corrupt, metric, args.kinds, tok, name) for m in METHODS[args.method]}
    data = report(found, lambda r: r.to_dict())
    if args.out:
        write_out(Path(args.out), data, found, f"{model.cfg.name}: restoring {name}")
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return 0
    first = next(iter(found.values()))
    print(f"{name}: clean {first.clean_metric:.4f}, corrupt {first.corrupt_metric:.4f}; "
          "each cell: the fraction of the difference a patch restores")
    print_methods({m: r.maps for m, r in found.items()}, first.clean_tokens, data.get("agreement"))
    if args.out:
        print(f"\nwrote {args.out}/{', '.join(written(found))}")
    return 0


def patched(method: str, model, clean, corrupt, metric, kinds, tok, name: str = "logit difference"):
    """Exact patching (one patched run per cell) or attribution patching (its first-order estimate) of a pair,
    or of two Batches of pairs: the same arguments, the same maps."""
    from ..inspect.attribution_patching import attribution_patching
    from ..inspect.patching import patching_maps

    run = patching_maps if method == "exact" else attribution_patching
    return run(model, clean, corrupt, metric, kinds=kinds, tokenizer=tok, metric_name=name)


def report(found: dict, to_dict) -> dict:
    """The JSON of one method's result; of both, each one's beside their agreement per site kind (Pearson's r)."""
    from ..inspect.attribution_patching import agreement

    if len(found) == 1:
        return to_dict(next(iter(found.values())))
    return {"exact": to_dict(found["exact"]), "attribution": to_dict(found["attribution"]),
            "agreement": {k: {w: _finite(r) for w, r in v.items()}
                          for k, v in agreement(found["exact"], found["attribution"]).items()}}


def written(found: dict) -> list[str]:
    return ["patching.json"] + [PLOTS[m] for m in found]


def write_out(out: Path, data: dict, found: dict, title: str) -> None:
    """patching.json (what --json prints) and each method's maps as a PNG (a dataset's: the mean maps)."""
    from ..files import write_text
    from ..report.figures import patching_plot

    write_text(out / "patching.json", json.dumps(data, ensure_ascii=False))
    for m, r in found.items():
        patching_plot(r, out / PLOTS[m], title=title + ("" if m == "exact" else " (attribution patching estimate)"))


def print_methods(maps: dict[str, dict], columns: list[str], agree: dict | None) -> None:
    """Each kind's map per method (exact, the attribution estimate, or both one after the other with their r)."""
    for kind in next(iter(maps.values())):
        for method, m in maps.items():
            print_maps({kind: m[kind]}, columns, f" ({LABELS[method]})" if len(maps) > 1 or method != "exact" else "")
        if agree is not None:
            r = ", ".join(f"{_r(v)} ({WHAT[w]})" for w, v in agree[kind].items())
            print(f"{kind}: the estimate against exact patching, Pearson's r = {r}")


def print_maps(maps: dict, columns: list[str], label: str = "") -> None:
    """Each kind's map as a table: a row per block, a column per position (or per head)."""
    for kind, m in maps.items():
        cols = [f"h{h}" for h in range(m.size(1))] if kind == "head" else columns[-m.size(-1):]
        print(f"\n{kind}{label}:")
        print(f"{'block':>6} " + "".join(f"{shown(c, 8):>9}" for c in cols))
        for i in range(m.size(0)):
            print(f"{i:>6} " + "".join(f"{float(v):>9.2f}" for v in m[i]))


def run_prompts(args: argparse.Namespace, model, tok) -> int:
    """Patching on every pair of a file (lumen.inspect.datasets.patch_prompts): each pair's metric and its best
    sites, then the mean maps."""
    from ..inspect.datasets import patch_prompts
    from ..inspect.patching import PatchingSet
    from ..prompts import read_prompts, with_answers

    prompts = read_prompts(args.prompts, tok, model.cfg.context, pairs=True)
    answer = tok.single_token(args.answer, "--answer") if args.answer else None
    wrong = tok.single_token(args.wrong, "--wrong") if args.wrong else None
    prompts = with_answers(prompts, answer, wrong, args.prompts)
    sets = patch_prompts(model, prompts, args.metric, args.kinds, METHODS[args.method], tok, args.batch_size,
                         source=args.prompts)
    name = "logit[answer] - logit[wrong]" if args.metric == "logit-diff" else "log p(answer)"

    def to_dict(dataset: PatchingSet) -> dict:
        data = dataset.to_dict()
        data["metric"] = name
        data["file"] = str(args.prompts)
        for d, p in zip(data["pairs"], prompts):
            d["line"] = p.line
        return data

    data = report(sets, to_dict)
    means = {m: s.averaged(name) for m, s in sets.items()}
    n = len(prompts)
    if args.out:
        write_out(Path(args.out), data, means, f"{model.cfg.name}: restoring {name}, mean over {n} pairs")
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return 0
    what = {"exact": "activation patching", "attribution": "attribution patching (the first-order estimate)",
            "both": "activation patching, exact and attribution patching's estimate side by side,"}[args.method]
    print(f"{what} on {n} pairs of {args.prompts}: the fraction of clean - corrupt each site restores")
    for method, dataset in sets.items():
        for p, r in zip(prompts, dataset.pairs):
            best = []
            for kind, m in r.maps.items():
                at = int(m.flatten().argmax())
                cell = (f"block {at // m.size(1)} head {at % m.size(1)}" if kind == "head" else
                        f"block {at // m.size(1)} at {quoted(r.clean_tokens[at % m.size(1)])}")
                best.append(f"{kind} {cell} {float(m.flatten()[at]):.2f}")
            tag = f" ({LABELS[method]})" if len(sets) > 1 else ""
            print(f"line {p.line:>4}{tag}: {r.metric_name}: clean {r.clean_metric:.4f}, corrupt "
                  f"{r.corrupt_metric:.4f}; most restored: {'; '.join(best)}")
    first = next(iter(means.values()))
    print(f"\nmean over the {n} pairs ({name}): clean {first.clean_metric:.4f}, corrupt {first.corrupt_metric:.4f}; "
          "each cell: (mean patched - mean corrupt) / (mean clean - mean corrupt); positions counted from each pair's "
          "end")
    print_methods({m: r.maps for m, r in means.items()}, first.clean_tokens, data.get("agreement"))
    if args.out:
        print(f"\nwrote {args.out}/{', '.join(written(sets))}")
    return 0


def _finite(r: float) -> float | None:
    """r for JSON: None where it is undefined (a map that is constant, e.g. all 0)."""
    return None if math.isnan(r) else round(r, 6)


def _r(r: float | None) -> str:
    return "undefined (a constant map)" if r is None else f"{r:.3f}"


