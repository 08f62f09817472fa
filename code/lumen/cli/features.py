"""`lumen features MODEL --sae DICT [--feature I]`: a sparse dictionary (SAE or transcoder, SAELens's folder
format, local or hf:ORG/NAME/FOLDER) on a model. Without --feature: how good it is on held-out text (fraction of
variance unexplained, L0, dead features, the next-token loss it recovers). With --feature: that feature's top
contexts (the token it fires on marked [[like this]]) and the tokens its decoder row promotes and suppresses.

`lumen features train MODEL --site blocks.N.resid_post [--kind topk --k 32 --width 8x] [--tokens N] --out DIR
[--resume]`: train a sparse autoencoder on a site (lumen.features.train); OUT/sae is the dictionary, in
SAELens's format, which `lumen features MODEL --sae OUT/sae` reads."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..errors import UserError
from ..tokenizers.shown import quoted
from .models import (
    MODEL_HELP,
    add_model_argument,
    add_out_argument,
    add_quiet_argument,
    add_text_arguments,
    at_least,
    check_corpus,
    load_with_tokenizer,
    rate,
    read_windows,
)


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="a sparse dictionary's features: its quality, or one feature's contexts and logits;"
                       " `features train MODEL --site SITE --out DIR` trains one",
                       usage="lumen features MODEL --sae DICT [--feature I] ...\n"
                             "       lumen features train MODEL --site SITE --out DIR [--kind topk --k 32 --width 8x] "
                             "[--tokens N] [--resume]")
    add_model_argument(p, MODEL_HELP + "; or `train` followed by the model")
    p.add_argument("trained", nargs="?", metavar="MODEL", help=argparse.SUPPRESS)   # after `train`
    p.add_argument("--sae", metavar="DICT",
                   help="a SAELens folder (cfg.json + sae_weights.safetensors) or hf:ORG/NAME/FOLDER")
    p.add_argument("--skip-first", type=int, default=None,
                   help="leave the first N positions of each window out of the measures (keeping the model's own "
                        "activation there): a model with an attention sink (default: what the dictionary's cfg.json "
                        "records as lumen_skip_first, else 0; train: 1)")
    p.add_argument("--feature", type=int, help="one feature (default: measure the whole dictionary)")
    add_text_arguments(p, seq_len=64, windows=32)
    p.add_argument("--contexts", type=int, default=8, help="top-activating contexts shown for --feature")
    p.add_argument("--tokens", type=int, default=None,
                   help="--feature: promoted and suppressed tokens shown (default: 8); train: the model's tokens the "
                        "dictionary trains on (default: 500,000)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_quiet_argument(p)
    t = p.add_argument_group("training (lumen features train MODEL ...)")
    t.add_argument("--site", help="the site the dictionary reads, e.g. blocks.15.resid_post")
    t.add_argument("--kind", default="topk", choices=("topk", "batchtopk", "relu"), help="the activation")
    t.add_argument("--k", type=int, default=32, help="active latents per token (topk, batchtopk)")
    t.add_argument("--width", default="8x", help="latents: 8x (times the site's width) or a count")
    t.add_argument("--batch", type=int, default=4096, help="activations per optimizer step")
    t.add_argument("--lr", type=rate, default=None, help="Adam's (default: 2e-4 / sqrt(latents / 2^14))")
    t.add_argument("--buffer-tokens", type=int, default=32768,
                   help="activations held in memory at once, shuffled (the memory bound: x width x 4 bytes)")
    t.add_argument("--reuse", type=int, default=1, help="times each activation is used")
    t.add_argument("--eval-interval", type=int, default=50, help="steps between held-out evaluations")
    t.add_argument("--eval-tokens", type=int, default=8192, help="held-out activations measured at each evaluation")
    t.add_argument("--report-windows", type=int, default=32,
                   help="held-out windows (of --seq-len) for the final report with the cross-entropy recovered")
    t.add_argument("--max-time", type=float, default=0.0, help="stop after this many seconds (0: none)")
    t.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the model's weights while it reads the activations (auto: bfloat16 where the CPU computes "
                        "it, ~2x faster; float32 elsewhere, where bfloat16 is emulated and many times slower)")
    add_out_argument(t, "the run's folder: checkpoints/, metrics.jsonl, report.json, and sae/ (the dictionary)")
    t.add_argument("--resume", action="store_true", help="go on from the newest checkpoint in --out")
    return p


def run(args: argparse.Namespace) -> int:
    from ..features import read_saelens
    from ..features.quality import quality
    from ..features.splice import check_fits
    from ..features.tools import check_feature, feature_logits, top_contexts, writes_stream
    from ..features.train import recorded_skip
    from ..inspect.neurons import shifted_tokens

    if args.model == "train":
        return train(args)
    if args.trained is not None:
        raise UserError(f"unexpected argument {args.trained!r}: `lumen features MODEL --sae DICT` takes one model "
                        f"(or train one: `lumen features train MODEL --site SITE --out DIR`)")
    if args.sae is None:
        raise UserError("--sae DICT is required (a SAELens folder or hf:ORG/NAME/FOLDER); or train one with "
                        "`lumen features train MODEL --site SITE --out DIR`")
    args.tokens = 8 if args.tokens is None else args.tokens
    at_least(args, "windows", "contexts", "tokens")
    at_least(args, "seq_len", least=2)
    sae = read_saelens(args.sae)                      # the small file first: a bad one fails before the model loads
    # the first positions a lumen-trained dictionary never saw (its cfg.json says), unless --skip-first says
    skip = recorded_skip(args.sae) if args.skip_first is None else args.skip_first
    if args.feature is not None:
        check_feature(sae, args.feature)
    check_corpus(args.corpus)                         # a missing corpus before the model loads
    model, tok = load_with_tokenizer(args.model)
    check_fits(model, sae)
    if args.feature is None:
        q = quality(model, sae, read_windows(model, tok, args, "val", args.windows, args.seed), skip=skip)
        if args.json:
            print(json.dumps({"site": sae.site, "d_sae": sae.d_sae, **q.to_dict()}))
            return 0
        print(f"{sae.d_sae:,} features on {sae.site} ({type(sae.act).__name__}), {q.tokens:,} tokens of {args.corpus}")
        show(q)
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


def train(args: argparse.Namespace) -> int:
    """`lumen features train MODEL --site SITE --out DIR`: train, report on held-out text, write OUT/sae."""
    from pathlib import Path

    import torch

    from ..features.train import FINAL, SAETrainConfig, SAETrainer
    from ..train.machine import TrainingInterrupted, use_bf16
    from .models import output_dir

    if args.trained is None:
        raise UserError("lumen features train: give the model after `train` (e.g. `lumen features train smollm2 "
                        "--site blocks.15.resid_post --out out/sae`)")
    if args.site is None or args.out is None:
        raise UserError("lumen features train needs --site (e.g. blocks.15.resid_post) and --out DIR")
    width = args.width.lower().removesuffix("x")
    if not width.isdigit() or int(width) < 1:
        raise UserError(f"--width {args.width!r}: give a multiple of the site's width (8x) or a count of latents")
    at_least(args, "k", "batch", "buffer_tokens", "reuse", "eval_interval", "eval_tokens", "report_windows")
    at_least(args, "seq_len", least=2)
    check_corpus(args.corpus)
    out = output_dir(args.out)
    if args.dtype == "auto":  # (train's choice for bf16 autocast)
        args.dtype = "bfloat16" if use_bf16("auto", torch.device("cpu")) else "float32"
    model, tok = load_with_tokenizer(args.trained, args.dtype)
    d_in = model.cfg.d_model
    multiple = int(width) if args.width.lower().endswith("x") else int(width) / d_in
    if multiple != int(multiple):
        raise UserError(f"--width {args.width}: the count must be a multiple of the site's width ({d_in})")
    cfg = SAETrainConfig(site=args.site, kind=args.kind, k=args.k, width=int(multiple),
                         tokens=args.tokens or 500_000, batch=args.batch, lr=args.lr or 0.0,
                         buffer_tokens=args.buffer_tokens, reuse=args.reuse, corpus=args.corpus, seq_len=args.seq_len,
                         skip_first=1 if args.skip_first is None else args.skip_first, eval_tokens=args.eval_tokens,
                         seed=args.seed, eval_interval=args.eval_interval, max_time=args.max_time)
    trainer = SAETrainer(model, tok, cfg, out, talks=not args.quiet, model_name=args.trained)
    t0 = time.perf_counter()
    try:
        trainer.run(resume=args.resume)
    except TrainingInterrupted as e:
        print(f"lumen features train: {e}; continue with --resume", file=sys.stderr)
        return 130
    trained = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(cfg.seed + 11)
    windows = trainer.stream.windows("val", args.report_windows * (cfg.seq_len - cfg.skip_first), gen)
    q = trainer.report(windows)
    s = trainer.seconds
    report = {"model": args.trained, "site": cfg.site, "kind": cfg.kind, "k": cfg.k, "d_sae": trainer.sae.d_sae,
              "steps": trainer.step, "tokens_read": trainer.read_tokens, "activations_trained": trainer.tokens,
              "train_seconds_this_session": round(trained, 1), "model_seconds": round(s["model"], 1),
              "sae_seconds": round(s["sae"], 1), "report_seconds": round(s["report"], 1),
              "model_cpu_seconds": round(s.get("model_cpu", 0.0), 1),
              "sae_cpu_seconds": round(s.get("sae_cpu", 0.0), 1),
              "report_cpu_seconds": round(s.get("report_cpu", 0.0), 1),
              "process_cpu_seconds": round(time.process_time(), 1),
              "load_average": [round(x, 2) for x in os.getloadavg()],
              "model_tokens_per_s": round(trainer.read_tokens / s["model"], 1) if s["model"] else None,
              "sae_activations_per_s": round(trainer.tokens / s["sae"], 1) if s["sae"] else None,
              "skip_first": cfg.skip_first, "dtype": args.dtype, "threads": torch.get_num_threads(),
              "settings": cfg.to_dict(), **q.to_dict()}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{trainer.sae.d_sae:,} {cfg.kind} latents on {cfg.site}, {trainer.step:,} steps, "
          f"{trainer.read_tokens:,} tokens read; held-out ({q.tokens:,} tokens of {cfg.corpus}):")
    show(q)
    print(f"  time: model {s['model']:.0f} s, dictionary {s['sae']:.0f} s, report {s['report']:.0f} s")
    print(f"wrote {Path(out) / FINAL} (read it with `lumen features {args.trained} --sae {Path(out) / FINAL} "
          f"--skip-first {cfg.skip_first}`)")
    return 0


def show(q) -> None:
    """A dictionary's quality (lumen.features.quality.Quality), in three lines."""
    typical = (f" ({q.fvu_typical:.3f} without the {q.massive} massive activations)" if q.massive else "")
    print(f"  fraction of variance unexplained {q.fvu:.3f}{typical}   L0 {q.l0:.1f}   dead {q.dead:.1%}")
    print(f"  next-token loss: model {q.loss:.3f}, spliced {q.loss_spliced:.3f}, site zeroed {q.loss_zeroed:.3f}"
          f" -> {q.ce_recovered:.1%} recovered")
    print(f"  error |x - x_hat| {q.error_norm:.3g} per token, beside |x| {q.site_norm:.3g}")
