"""Experiment `norm-placement`: post-LN (x = LN(x + f(x))) against pre-LN (x = x + f(LN(x))) at several depths,
with and without learning-rate warm-up; and the per-layer gradient norms at initialisation."""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig
from .fit import grad_norms, sample_batch, shakespeare, train_lm, unigram_loss
from .result import Result, Table, figure
from .stacks import build

NAME = "norm-placement"
CLAIM = ("Post-LN puts the norm on the residual highway: its gradients are uneven across layers (the chapter: larger "
         "at the bottom), it needs learning-rate warm-up and becomes unstable deep; pre-LN keeps the highway clean "
         "and trains without warm-up at any depth.")

SIZES: dict[bool, dict[str, Any]] = {
    False: dict(depths=[2, 6, 12], d=64, steps=150, warmup=30, lr=1e-3, batch=16, eval_windows=64, grad_depth=12),
    True: dict(depths=[2, 6], d=32, steps=20, warmup=5, lr=1e-3, batch=8, eval_windows=16, grad_depth=6),
}
PLACEMENTS = ("pre", "post")


def run(quick: bool, seed: int) -> Result:
    s = SIZES[quick]
    data = shakespeare()
    T = 64

    def cfg(n: int, placement: str) -> ModelConfig:
        return ModelConfig(vocab_size=data.tokenizer.vocab_size, context=T, d_model=s["d"], n_layers=n, n_heads=4,
                           activation="gelu", norm_placement=placement)

    x, y = sample_batch(data, "train", s["batch"], T, seed)
    grads = {}
    for placement in PLACEMENTS:
        torch.manual_seed(seed)
        grads[placement] = grad_norms(build(cfg(s["grad_depth"], placement)), x, y)

    runs = {}
    for placement in PLACEMENTS:
        for warmup in (0, s["warmup"]):
            for n in s["depths"]:
                torch.manual_seed(seed)
                runs[placement, warmup, n] = train_lm(build(cfg(n, placement)), data, s["steps"], lr=s["lr"],
                                                      warmup=warmup, batch_size=s["batch"], seed=seed,
                                                      eval_windows=s["eval_windows"])

    def val(h):
        return "diverged" if h.diverged else h.final_val

    rows = [[f"{p}-LN", f"{w} steps" if w else "none"] + [val(runs[p, w, n]) for n in s["depths"]]
            for p in PLACEMENTS for w in (0, s["warmup"])]
    t1 = Table(f"Validation loss after {s['steps']} steps at peak lr {s['lr']} (Shakespeare, characters, d={s['d']}); "
               f"predicting character frequencies alone: {unigram_loss(data):.3f}",
               ["placement", "warm-up"] + [f"{n} blocks" for n in s["depths"]], rows)
    g = s["grad_depth"]
    t2 = Table(f"Gradient norm per block at initialisation, {g} blocks (one batch)",
               ["placement", "block 1 (bottom)", f"block {g // 2}", f"block {g} (top)", "bottom / top"],
               [[f"{p}-LN", grads[p][0], grads[p][g // 2 - 1], grads[p][-1], grads[p][0] / grads[p][-1]]
                for p in PLACEMENTS])

    deep, w = max(s["depths"]), s["warmup"]

    def v(p, wu, n=deep):
        h = runs[p, wu, n]
        return float("inf") if h.diverged else h.final_val

    unigram = unigram_loss(data)
    stuck = {(p, wu): [n for n in s["depths"] if abs(v(p, wu, n) - unigram) < 0.05] for p in PLACEMENTS
             for wu in (0, w)}
    post_needs_warmup = v("post", 0) > v("post", w) + 0.02
    pre_fine = v("pre", 0) <= v("pre", w) + 0.05
    post_worse_deep = v("post", w) > v("pre", w) + 0.02
    bottom_top = {p: grads[p][0] / grads[p][-1] for p in PLACEMENTS}

    def blocks(ns):
        return " and ".join(str(n) for n in ns) + " blocks"

    failed = ""
    if stuck["post", 0] or stuck["post", w]:
        both = sorted(set(stuck["post", 0]) & set(stuck["post", w]))
        failed = (f" Post-LN fails to train at {blocks(both)} with and without warm-up: it stays at the loss of "
                  f"predicting character frequencies ({unigram:.2f})." if both else
                  f" Post-LN stays at the character-frequency loss ({unigram:.2f}) at {blocks(stuck['post', 0])} "
                  f"without warm-up and at {blocks(stuck['post', w]) if stuck['post', w] else 'no depth'} with it.")
    verdict = (f"At init post-LN's bottom/top gradient ratio is {bottom_top['post']:.2f} against pre-LN's "
               f"{bottom_top['pre']:.2f}"
               + (" (post-LN's gradients are larger at the bottom, as the chapter says). " if bottom_top["post"] > 1.5
                  else " (post-LN's gradients are larger at the top, as Xiong et al. (2020) measured, not at the "
                       "bottom as the chapter says). " if bottom_top["post"] < 1 / 1.5 else
                  " (no strong unevenness at this size). ")
               + f"At {deep} blocks without warm-up post-LN reaches {v('post', 0):.3f}, with warm-up "
               f"{v('post', w):.3f}" + (" (it needs warm-up)" if post_needs_warmup else
                                        " (warm-up does not rescue it here; it is worse with warm-up at every depth)"
                                        if all(v("post", w, n) > v("post", 0, n) for n in s["depths"]) else
                                        " (warm-up does not rescue it here)")
               + f"; pre-LN reaches {v('pre', 0):.3f} without and {v('pre', w):.3f} with"
               + (" (it trains without warm-up)" if pre_fine else " (it too does better with warm-up at this depth "
                                                                  "and learning rate)")
               + (", and post-LN is behind pre-LN deep." if post_worse_deep else
                  ". Post-LN is not behind pre-LN at this depth and budget; its instability needs deeper models "
                  "or longer runs than this budget.")
               + failed)
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for p in PLACEMENTS:
        ax1.plot(range(1, g + 1), grads[p], "o-", label=f"{p}-LN")
        for wu, ls in ((0, "--"), (w, "-")):
            ax2.plot(s["depths"], [v(p, wu, n) for n in s["depths"]], ls, marker="o",
                     label=f"{p}-LN, warm-up {wu}")
    ax1.set(xlabel="block", ylabel="gradient norm", yscale="log", title=f"gradient per block at init ({g} blocks)")
    ax2.set(xlabel="blocks", ylabel="validation loss", title=f"after {s['steps']} steps, lr {s['lr']}")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    numbers = {"grad_norms_at_init": grads,
               "runs": [{"placement": p, "warmup": wu, "blocks": n, "diverged": h.diverged, "val": h.final_val,
                         "final_loss": h.final_loss} for (p, wu, n), h in runs.items()]}
    return Result(NAME, CLAIM, [t1, t2], verdict, numbers, {"norm-placement": fig},
                  ["Both placements use lumen's GPT-2 initialisation (embeddings and weights N(0, 0.02^2), stream "
                   "writes scaled by 1/sqrt(2N)); the original post-LN transformer scaled its embeddings by sqrt(d)."])
