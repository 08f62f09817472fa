"""Experiment `init-scaling`: the stream's variance through 48 blocks at initialisation, with and without
GPT-2's 1/sqrt(2N) rule for the matrices that write into the stream, and what it does to early training."""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig
from .fit import shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "init-scaling"
CLAIM = ("Without the rule each of the 2N writes adds ~sigma^2 to the stream's variance: after 48 blocks it has "
         "grown ~96-fold (a factor sqrt(96) ~ 10 in size); scaling W_O and W_2 by 1/sqrt(2N) keeps the stream the "
         "same size from the first block to the last.")

SIZES: dict[bool, dict[str, Any]] = {
    # stream: the 48-block model measured at init; train: a deeper-than-usual model trained briefly both ways
    False: dict(n_layers=48, d_model=128, batch=8, context=64, train_layers=16, train_d=64, steps=120, eval_windows=64),
    True: dict(n_layers=48, d_model=128, batch=4, context=32, train_layers=8, train_d=32, steps=15, eval_windows=16),
}


@torch.no_grad()
def stream_variance(model, idx: torch.Tensor) -> list[float]:
    """The stream's variance (over batch, positions and dimensions) after the embedding and each block."""
    x = model.embed(idx)
    out = [x.var().item()]
    for block in model.blocks:
        x = block(x)
        out.append(x.var().item())
    return out


def run(quick: bool, seed: int) -> Result:
    s = SIZES[quick]
    n = s["n_layers"]
    cfg = ModelConfig(vocab_size=256, context=s["context"], d_model=s["d_model"], n_layers=n, n_heads=4,
                      activation="gelu")
    idx = torch.randint(0, 256, (s["batch"], s["context"]), generator=torch.Generator().manual_seed(seed))
    var = {}
    for rule in (True, False):
        torch.manual_seed(seed)
        var[rule] = stream_variance(build(cfg, "residual", residual_rule=rule).eval(), idx)
    added = {r: v[-1] - v[0] for r, v in var.items()}
    ratio_added = added[False] / added[True]
    size_ratio = (var[False][-1] / var[True][-1]) ** 0.5
    growth = {r: v[-1] / v[1] for r, v in var.items()}   # last block's output against the first block's

    # early training: the same deep model with and without the rule
    data = shakespeare()
    tcfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=64, d_model=s["train_d"],
                       n_layers=s["train_layers"], n_heads=4, activation="gelu")
    hist = {}
    for rule in (True, False):
        torch.manual_seed(seed)
        hist[rule] = train_lm(build(tcfg, "residual", residual_rule=rule), data, s["steps"], lr=1e-3,
                              warmup=s["steps"] // 10, batch_size=16, seed=seed, eval_windows=s["eval_windows"])

    rows = [[f"with 1/sqrt(2N) (writes at std {0.02 / (2 * n) ** 0.5:.4f})", var[True][0], var[True][1],
             var[True][-1], growth[True], hist[True].final_loss, hist[True].final_val],
            ["without (writes at std 0.02)", var[False][0], var[False][1], var[False][-1], growth[False],
             hist[False].final_loss, hist[False].final_val]]
    table = Table(f"Stream variance through {n} blocks at init (d={s['d_model']}); then {s['steps']} training steps "
                  f"of a {s['train_layers']}-block, d={s['train_d']} model on Shakespeare",
                  ["init", "var(embedding)", "var(after block 1)", f"var(after block {n})",
                   f"block {n} / block 1", "train loss (end)", "val loss (end)"], rows)
    t2 = Table("", ["quantity", "measured", "chapter"],
               [["variance added by the writes, without / with the rule", ratio_added, f"2N = {2 * n}"],
                ["size (std) of the final stream, without / with", size_ratio, f"sqrt(2N) = {(2 * n) ** 0.5:.1f}"]])
    agree = 2 * n / 2 < ratio_added < 2 * n * 2
    verdict = (f"The writes add {ratio_added:.0f}x more variance without the rule than with it (the chapter's 2N = "
               f"{2 * n}), so the final stream is {size_ratio:.1f}x larger; with the rule it ends at "
               f"{growth[True]:.2f}x its size after block 1 instead of {growth[False]:.1f}x. "
               + ("This agrees with the chapter. " if agree else "This does not match the chapter's 2N. ")
               + f"Early training of the {s['train_layers']}-block model: val loss {hist[True].final_val:.3f} with "
               f"the rule vs {hist[False].final_val:.3f} without after {s['steps']} steps"
               + (" (the rule helps)." if hist[True].final_val < hist[False].final_val - 0.02 else
                  " (the rule hurts here)." if hist[True].final_val > hist[False].final_val + 0.02 else
                  " (no clear difference, under 0.02 nats, at this depth and budget)."))

    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for rule, label in ((False, "without the rule"), (True, "with 1/sqrt(2N)")):
        ax1.plot(range(n + 1), var[rule], label=label)
        ax2.plot(hist[rule].loss, lw=0.8, label=label)
    ax1.set(xlabel="blocks", ylabel="stream variance", yscale="log", title=f"stream variance at init, {n} blocks")
    ax2.set(xlabel="step", ylabel="training loss", title=f"early training, {s['train_layers']} blocks")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    numbers = {"variance_with_rule": var[True], "variance_without_rule": var[False],
               "added_variance_ratio": ratio_added, "final_std_ratio": size_ratio, "n_layers": n,
               "train": {str(r): {"loss": hist[r].loss, "val": hist[r].val} for r in hist}}
    return Result(NAME, CLAIM, [table, t2], verdict, numbers, {"stream-variance": fig})
