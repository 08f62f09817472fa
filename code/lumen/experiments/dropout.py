"""Experiment `dropout`: dropout 0 against 0.1, when the training data is seen once against many epochs over a
small slice of it."""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig
from .fit import shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "dropout"
CLAIM = ("Dropout is a regulariser: it helps only when the model sees the same data repeatedly (small data, many "
         "epochs); trained once over fresh data there is nothing to memorise and it only slows learning.")

SIZES: dict[bool, dict[str, Any]] = {
    False: dict(d=128, layers=4, steps=500, batch=16, lr=2e-3, eval_windows=64, slice_tokens=5_000, evals=5),
    True: dict(d=64, layers=2, steps=60, batch=8, lr=3e-3, eval_windows=16, slice_tokens=2_000, evals=3),
}


def run(quick: bool, seed: int) -> Result:
    s = SIZES[quick]
    data = shakespeare()
    T = 64
    seen = s["steps"] * s["batch"] * T
    regimes = {"fresh data (seen once)": None, f"{s['slice_tokens']:,}-token slice (many epochs)": s["slice_tokens"]}
    runs = {}
    for regime, tokens in regimes.items():
        for p in (0.0, 0.1):
            cfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=T, d_model=s["d"], n_layers=s["layers"],
                              n_heads=4, activation="gelu", dropout=p)
            torch.manual_seed(seed)
            runs[regime, p] = train_lm(build(cfg), data, s["steps"], lr=s["lr"], warmup=s["steps"] // 10,
                                       batch_size=s["batch"], seed=seed, eval_windows=s["eval_windows"],
                                       evals=s["evals"], train_tokens=tokens)
    epochs = {r: seen / (t or len(data.tokens("train"))) for r, t in regimes.items()}
    rows = [[r, f"{epochs[r]:.3g}", runs[r, 0.0].final_loss, runs[r, 0.0].final_val, runs[r, 0.1].final_loss,
             runs[r, 0.1].final_val, runs[r, 0.1].final_val - runs[r, 0.0].final_val] for r in regimes]
    table = Table(f"{s['layers']} layers, d={s['d']}, {s['steps']} steps ({seen:,} training tokens), Shakespeare "
                  "characters; validation on held-out works",
                  ["data", "epochs", "train loss, p=0", "val loss, p=0", "train loss, p=0.1", "val loss, p=0.1",
                   "val change with dropout"], rows)
    fresh, small = regimes
    d_fresh = runs[fresh, 0.1].final_val - runs[fresh, 0.0].final_val
    d_small = runs[small, 0.1].final_val - runs[small, 0.0].final_val
    best_small = {p: min(v for _, v in runs[small, p].val) for p in (0.0, 0.1)}
    verdict = (f"On fresh data dropout changes the validation loss by {d_fresh:+.3f}; on the small slice "
               f"({epochs[small]:.0f} epochs) by {d_small:+.3f}"
               + (": it helps only when the data repeats, as the chapter says."
                  if d_small < -0.01 and d_fresh > -0.01 else
                  ". The chapter's pattern does not show at this size." if not quick else
                  " (the quick size is too short to show the effect).")
               + f" Best validation loss on the slice during training: {best_small[0.0]:.3f} without, "
               f"{best_small[0.1]:.3f} with dropout.")
    fig, axes = figure(2, 5.5, 4)
    for ax, regime in zip(axes, regimes):
        for p in (0.0, 0.1):
            h = runs[regime, p]
            ax.plot(h.loss, lw=0.6, alpha=0.6, label=f"train, p={p}")
            ax.plot(*zip(*h.val), "o-", label=f"val, p={p}")
        ax.set(xlabel="step", ylabel="loss", title=regime)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    numbers = {f"{r} | p={p}": {"val": h.val, "final_loss": h.final_loss, "loss": h.loss}
               for (r, p), h in runs.items()}
    numbers["epochs"] = epochs
    return Result(NAME, CLAIM, [table], verdict, numbers, {"dropout": fig})
