"""`lumen tuned-lens train MODEL [--corpus shakespeare] [--steps N] [--out FILE]`: train a tuned lens,
then compare it with the logit lens on held-out text (KL to the final output and perplexity per layer).

`lumen tuned-lens eval MODEL LENS [--corpus ...]` repeats the comparison for a saved lens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import UserError
from .models import add_model_argument, add_text_arguments, load_with_tokenizer, read_windows


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="train a tuned lens for a model, or evaluate one against the logit lens")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    train = actions.add_parser("train", help="train a tuned lens on a corpus and report both lenses per layer")
    add_model_argument(train)
    train.add_argument("--steps", type=int, default=24, help="optimizer steps (default 24)")
    train.add_argument("--batch", type=int, default=1, help="windows per step (default 1)")
    train.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate, decayed linearly to 0")
    train.add_argument("--out", metavar="FILE", help="where to save the lens (default NAME.tuned-lens.safetensors)")
    evaluate = actions.add_parser("eval", help="compare a saved tuned lens with the logit lens on held-out text")
    add_model_argument(evaluate, "the model the lens was trained for")
    evaluate.add_argument("lens", help="a .safetensors file written by `lumen tuned-lens train`")
    for a in (train, evaluate):
        add_text_arguments(a, seq_len=128)
        a.add_argument("--eval-windows", type=int, default=8, help="held-out windows for the report (default 8)")
        a.add_argument("--report", metavar="DIR", help="write tuned_lens.json and kl.png / perplexity.png here")
        a.add_argument("--json", action="store_true", help="print the per-layer comparison as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.lens import LogitLens, evaluate_lens
    from ..inspect.tuned_lens import TunedLens, train_tuned_lens
    from ..report.figures import layer_name

    for flag in ("seq_len", "eval_windows") + (("steps", "batch") if args.action == "train" else ()):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    model, tok = load_with_tokenizer(args.model)
    seconds = None
    if args.action == "train":
        out = Path(args.out or f"{model.cfg.name}.tuned-lens.safetensors")
        windows = read_windows(model, tok, args, "train", args.steps * args.batch, args.seed)
        start = time.time()

        def log(step: int, kl: float) -> None:
            print(f"step {step + 1}/{args.steps}  mean KL over layers {kl:.3f}  ({time.time() - start:.0f}s)",
                  file=sys.stderr, flush=True)

        lens = train_tuned_lens(model, iter(windows.split(args.batch)), args.steps, args.lr, log=log)
        seconds = time.time() - start
        lens.save(out)
        print(f"saved {out} ({seconds:.0f}s, {windows.numel()} training tokens)", file=sys.stderr)
    else:
        lens = TunedLens.load(args.lens, model)
    held = read_windows(model, tok, args, "val", args.eval_windows, args.seed + 1)
    logit = evaluate_lens(model, LogitLens(model), held.split(2))
    tuned = evaluate_lens(model, lens, held.split(2))
    report = {"model": model.cfg.name, "heldout_tokens": held.numel(), "train_seconds": seconds,
              "logit_lens": logit, "tuned_lens": tuned}
    if args.report:
        write_report(Path(args.report), report)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"held-out {held.numel()} tokens of {args.corpus}: KL(final || lens) in nats, and perplexity, per layer")
    print(f"{'after':>9}{'KL logit':>12}{'KL tuned':>12}{'ppl logit':>14}{'ppl tuned':>14}")
    for i in range(len(logit["kl"])):
        print(f"{layer_name(i):>9}{logit['kl'][i]:>12.3f}{tuned['kl'][i]:>12.3f}"
              f"{logit['perplexity'][i]:>14.1f}{tuned['perplexity'][i]:>14.1f}")
    return 0


def write_report(out: Path, report: dict) -> None:
    from ..files import write_text
    from ..report.figures import layer_curves

    write_text(out / "tuned_lens.json", json.dumps(report, indent=1))
    curves = {"logit lens": report["logit_lens"]["kl"], "tuned lens": report["tuned_lens"]["kl"]}
    layer_curves(curves, out / "kl.png", title="KL to the final output on held-out text", log=True)
    curves = {"logit lens": report["logit_lens"]["perplexity"], "tuned lens": report["tuned_lens"]["perplexity"]}
    layer_curves(curves, out / "perplexity.png", ylabel="perplexity", title="perplexity by layer", log=True)
