"""`lumen tuned-lens train MODEL [--corpus shakespeare] [--steps N] [--out DIR]`: train a tuned lens,
then compare it with the logit lens on held-out text (KL to the final output and perplexity after each block).
DIR gets tuned-lens.safetensors (what `lumen lens --tuned DIR` reads), tuned_lens.json, kl.png and
perplexity.png.

`lumen tuned-lens eval MODEL LENS [--corpus ...] [--out DIR]` repeats the comparison for a saved lens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .. import names
from .lens import LENS_FILE, TRAIN_ONE, lens_file
from .models import (
    add_model_argument,
    add_out_argument,
    add_quiet_argument,
    add_text_arguments,
    at_least,
    check_corpus,
    input_file,
    load_with_tokenizer,
    output_dir,
    rate,
    read_windows,
)


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="train a tuned lens for a model, or evaluate one against the logit lens",
                       description=__doc__.split("\n\n")[0])
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    train = actions.add_parser("train", help="train a tuned lens on a corpus and report both lenses after each block")
    add_model_argument(train)
    train.add_argument("--steps", type=int, default=24, help="optimizer steps")
    train.add_argument("--batch", type=int, default=1, help="windows per step")
    train.add_argument("--lr", type=rate, default=3e-3, help="Adam learning rate, decayed linearly to 0")
    add_out_argument(train, f"write {LENS_FILE} and the report (tuned_lens.json, kl.png, perplexity.png) "
                            "into this folder (default: MODEL-NAME.tuned-lens)", "--report")
    evaluate = actions.add_parser("eval", help="compare a saved tuned lens with the logit lens on held-out text")
    add_model_argument(evaluate, "the model the lens was trained for")
    evaluate.add_argument("lens", help="the folder `lumen tuned-lens train` wrote, or its .safetensors file")
    add_out_argument(evaluate, "write tuned_lens.json, kl.png and perplexity.png into this folder", "--report")
    for a in (train, evaluate):
        add_text_arguments(a, seq_len=128)
        a.add_argument("--eval-windows", type=int, default=8, help="held-out windows for the report")
        a.add_argument("--json", action="store_true", help="print the comparison as JSON")
        add_quiet_argument(a)
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.lens import LogitLens, evaluate_lens
    from ..inspect.tuned_lens import TunedLens, train_tuned_lens
    from ..progress import progress

    at_least(args, "seq_len", "eval_windows", *(("steps", "batch") if args.action == "train" else ()))
    out = output_dir(args.out) if args.out else None
    if args.action == "eval":
        input_file(lens_file(args.lens), "LENS", "tuned lens", TRAIN_ONE)
    check_corpus(args.corpus)
    model, tok = load_with_tokenizer(args.model)
    seconds = None
    if args.action == "train":
        out = out or output_dir(f"{model.cfg.name}.tuned-lens")
        windows = read_windows(model, tok, args, "train", args.steps * args.batch, args.seed, "--steps x --batch")
        start = time.time()
        lens, done = TunedLens(model), [0]   # trained in place, so that a Ctrl-C keeps the steps done

        def count(step: int, kl: float) -> None:
            done[0] = step + 1

        print(f"training a tuned lens for {args.steps} steps (Ctrl-C saves the lens trained so far to "
              f"{out / LENS_FILE})", file=sys.stderr, flush=True)
        try:
            train_tuned_lens(model, iter(windows.split(args.batch)), args.steps, args.lr, lens=lens, log=count)
        except KeyboardInterrupt:
            return interrupted(lens, out / LENS_FILE, done[0], args.steps)
        seconds = time.time() - start
        lens.save(out / LENS_FILE)
        print(f"saved {out / LENS_FILE} ({seconds:.0f}s, {windows.numel()} training tokens)", file=sys.stderr)
    else:
        lens = TunedLens.load(lens_file(args.lens), model)
    held = read_windows(model, tok, args, "val", args.eval_windows, args.seed + 1, "--eval-windows")
    pairs = held.split(2)
    # one bar, one estimate, for both evaluations (each batch about the same work in either)
    with progress(total=2 * len(pairs), desc="evaluating the logit and the tuned lens", unit="batch"):
        logit = evaluate_lens(model, LogitLens(model), pairs, desc="logit lens on held-out text")
        tuned = evaluate_lens(model, lens, pairs, desc="tuned lens on held-out text")
    n = len(logit["kl"])
    report = {"model": model.cfg.name, "heldout_tokens": held.numel(), "train_seconds": seconds,
              "after": [names.stream(i) for i in range(n)], "logit_lens": logit, "tuned_lens": tuned}
    if out:
        write_report(out, report)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"held-out {held.numel()} tokens of {args.corpus}: KL(final || lens) in nats, and perplexity, "
          "after the embedding and each block")
    print(f"{'after':>9}{'KL logit':>12}{'KL tuned':>12}{'ppl logit':>14}{'ppl tuned':>14}")
    for i in range(n):
        print(f"{names.stream(i):>9}{logit['kl'][i]:>12.3f}{tuned['kl'][i]:>12.3f}"
              f"{logit['perplexity'][i]:>14.1f}{tuned['perplexity'][i]:>14.1f}")
    return 0


def interrupted(lens, path: Path, done: int, steps: int) -> int:
    """Ctrl-C during training: save the lens as its finished steps left it (atomically: a second Ctrl-C
    leaves the old file or none, never half of one) and say where; exit status 130, as for any interrupt."""
    if done == 0:
        print("lumen tuned-lens: interrupted before the first step finished: nothing trained, nothing saved",
              file=sys.stderr)
        return 130
    lens.save(path)
    print(f"lumen tuned-lens: interrupted after step {done} of {steps}: saved the lens trained so far to {path} "
          f"(`lumen lens --tuned {path.parent}` reads it; train again for all {steps} steps)", file=sys.stderr)
    return 130


def write_report(out: Path, report: dict) -> None:
    from ..files import write_text
    from ..report.figures import layer_curves

    write_text(out / "tuned_lens.json", json.dumps(report, indent=1))
    curves = {"logit lens": report["logit_lens"]["kl"], "tuned lens": report["tuned_lens"]["kl"]}
    layer_curves(curves, out / "kl.png", title="KL to the final output on held-out text", log=True)
    curves = {"logit lens": report["logit_lens"]["perplexity"], "tuned lens": report["tuned_lens"]["perplexity"]}
    layer_curves(curves, out / "perplexity.png", ylabel="perplexity", title="perplexity after each block", log=True)
