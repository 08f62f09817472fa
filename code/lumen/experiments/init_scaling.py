"""Experiment `init-scaling`: the stream's variance through 48 blocks at initialisation, with and without
GPT-2's 1/sqrt(2N) rule for the matrices that write into the stream, and what it does to early training."""

from __future__ import annotations

from typing import TypedDict

import torch

from ..config import ModelConfig
from ..inspect.stack import stream_variance
from .fit import expect, shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "init-scaling"
CLAIM = ("Without the rule each of the 2N writes adds ~sigma^2 to the stream's variance: after 48 blocks it has "
         "grown ~96-fold (a factor sqrt(96) ~ 10 in size); scaling W_O and W_2 by 1/sqrt(2N) keeps the stream the "
         "same size from the first block to the last.")


class Size(TypedDict):
    n_layers: int       # the stream measured at init through this many blocks (the chapter's N = 48)
    d_model: int
    batch: int
    context: int
    train_layers: int   # a deeper-than-usual model trained briefly with and without the rule
    train_d: int
    steps: int
    eval_windows: int


SIZES = {
    False: Size(n_layers=48, d_model=128, batch=8, context=64, train_layers=16, train_d=64, steps=120,
                eval_windows=64),
    True: Size(n_layers=48, d_model=128, batch=4, context=32, train_layers=8, train_d=32, steps=15, eval_windows=16),
}


def measure(size: Size, seed: int) -> dict:
    """The stream's variance after every block at init with and without the rule, and early training both ways."""
    s = size
    expect(2 * s["steps"])   # the two training runs at the end
    n = s["n_layers"]
    cfg = ModelConfig(vocab_size=256, context=s["context"], d_model=s["d_model"], n_layers=n, n_heads=4,
                      activation="gelu")
    idx = torch.randint(0, 256, (s["batch"], s["context"]), generator=torch.Generator().manual_seed(seed))
    var = {}
    for rule in (True, False):  # (no gradients for the variances; the training runs below need them)
        torch.manual_seed(seed)
        with torch.no_grad():
            var[rule] = stream_variance(build(cfg, "residual", residual_rule=rule).eval(), idx)
    added = {r: v[-1] - v[0] for r, v in var.items()}
    data = shakespeare()
    tcfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=64, d_model=s["train_d"],
                       n_layers=s["train_layers"], n_heads=4, activation="gelu")
    hist = {}
    for rule in (True, False):
        torch.manual_seed(seed)
        hist[rule] = train_lm(build(tcfg, "residual", residual_rule=rule), data, s["steps"], lr=1e-3,
                              warmup=s["steps"] // 10, batch_size=16, seed=seed, eval_windows=s["eval_windows"])
    return {"variance_with_rule": var[True], "variance_without_rule": var[False],
            "added_variance_ratio": added[False] / added[True],
            "final_std_ratio": (var[False][-1] / var[True][-1]) ** 0.5, "n_layers": n,
            "train": {str(r): {"loss": hist[r].loss, "val": hist[r].val, "final_loss": hist[r].final_loss,
                               "final_val": hist[r].final_val} for r in hist}}


def growth(n: dict) -> dict[bool, float]:
    """The last block's output's variance against the first block's, with the rule (True) and without."""
    return {r: v[-1] / v[1] for r, v in ((True, n["variance_with_rule"]), (False, n["variance_without_rule"]))}


def tables(n: dict, s: Size) -> list[Table]:
    L, g, t = n["n_layers"], growth(n), n["train"]
    var = {True: n["variance_with_rule"], False: n["variance_without_rule"]}
    rows = [[label, var[r][0], var[r][1], var[r][-1], g[r], t[str(r)]["final_loss"], t[str(r)]["final_val"]]
            for r, label in ((True, f"with 1/sqrt(2N) (writes at std {0.02 / (2 * L) ** 0.5:.4f})"),
                             (False, "without (writes at std 0.02)"))]
    table = Table(f"Stream variance through {L} blocks at init (d={s['d_model']}); then {s['steps']} training steps "
                  f"of a {s['train_layers']}-block, d={s['train_d']} model on Shakespeare",
                  ["init", "var(embedding)", "var(after block 0)", f"var(after block {L - 1})",
                   f"block {L - 1} / block 0", "train loss (end)", "val loss (end)"], rows)
    t2 = Table("", ["quantity", "measured", "chapter"],
               [["variance added by the writes, without / with the rule", n["added_variance_ratio"], f"2N = {2 * L}"],
                ["size (std) of the final stream, without / with", n["final_std_ratio"],
                 f"sqrt(2N) = {(2 * L) ** 0.5:.1f}"]])
    return [table, t2]


def verdict(n: dict, s: Size) -> str:
    L, g = n["n_layers"], growth(n)
    ratio_added, with_rule, without = n["added_variance_ratio"], n["train"]["True"], n["train"]["False"]
    agree = 2 * L / 2 < ratio_added < 2 * L * 2
    return (f"The writes add {ratio_added:.0f}x more variance without the rule than with it (the chapter's 2N = "
            f"{2 * L}), so the final stream is {n['final_std_ratio']:.1f}x larger; with the rule it ends at "
            f"{g[True]:.2f}x its size after block 0 instead of {g[False]:.1f}x. "
            + ("This agrees with the chapter. " if agree else "This does not match the chapter's 2N. ")
            + f"Early training of the {s['train_layers']}-block model: val loss {with_rule['final_val']:.3f} with "
            f"the rule vs {without['final_val']:.3f} without after {s['steps']} steps"
            + (" (the rule helps)." if with_rule["final_val"] < without["final_val"] - 0.02 else
               " (the rule hurts here)." if with_rule["final_val"] > without["final_val"] + 0.02 else
               " (no clear difference, under 0.02 nats, at this depth and budget)."))


def draw(n: dict, s: Size):
    """The stream's variance through the blocks at init, and early training's loss, with and without the rule."""
    L = n["n_layers"]
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for rule, label, key in ((False, "without the rule", "variance_without_rule"),
                             (True, "with 1/sqrt(2N)", "variance_with_rule")):
        ax1.plot(range(L + 1), n[key], label=label)
        ax2.plot(n["train"][str(rule)]["loss"], lw=0.8, label=label)
    ax1.set(xlabel="blocks", ylabel="stream variance", yscale="log", title=f"stream variance at init, {L} blocks")
    ax2.set(xlabel="step", ylabel="training loss", title=f"early training, {s['train_layers']} blocks")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"stream-variance": draw(n, size)})
