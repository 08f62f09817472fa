"""Experiment `dropout`: dropout 0 against 0.1, when the training data is seen once against many epochs over a
small slice of it."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .fit import TrainingSize, expect, shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "dropout"
CLAIM = ("Dropout is a regulariser: it helps only when the model sees the same data repeatedly (small data, many "
         "epochs); trained once over fresh data there is nothing to memorise and it only slows learning.")


class Size(TrainingSize):
    slice_tokens: int   # the small slice of the training split seen over many epochs
    evals: int          # validations spread over each run


SIZES = {
    False: Size(d=128, layers=4, steps=500, batch=16, lr=2e-3, eval_windows=64, slice_tokens=5_000, evals=5),
    True: Size(d=64, layers=2, steps=60, batch=8, lr=3e-3, eval_windows=16, slice_tokens=2_000, evals=3),
}
T = 64
RATES = (0.0, 0.1)


def regimes(s: Size) -> dict[str, int | None]:
    """The two kinds of training data: label -> the training tokens drawn from (None: the whole split)."""
    return {"fresh data (seen once)": None, f"{s['slice_tokens']:,}-token slice (many epochs)": s["slice_tokens"]}


def measure(size: Size, seed: int) -> dict:
    """The same model trained with dropout 0 and 0.1 on fresh data and on a small slice: every run's losses."""
    s = size
    data = shakespeare()
    seen = s["steps"] * s["batch"] * T
    numbers: dict = {}
    expect(len(regimes(s)) * len(RATES) * s["steps"])
    for regime, tokens in regimes(s).items():
        for p in RATES:
            cfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=T, d_model=s["d"], n_layers=s["layers"],
                              n_heads=4, activation="gelu", dropout=p)
            torch.manual_seed(seed)
            h = train_lm(build(cfg), data, s["steps"], lr=s["lr"], warmup=s["steps"] // 10, batch_size=s["batch"],
                         seed=seed, eval_windows=s["eval_windows"], evals=s["evals"], train_tokens=tokens)
            numbers[key(regime, p)] = {"val": h.val, "final_loss": h.final_loss, "loss": h.loss}
    numbers["epochs"] = {r: seen / (t or len(data.tokens("train"))) for r, t in regimes(s).items()}
    return numbers


def key(regime: str, p: float) -> str:
    return f"{regime} | p={p}"


def final_val(run: dict) -> float:
    """A run's last validation loss (nan: it diverged)."""
    return run["val"][-1][1] if run["val"] else float("nan")


def tables(n: dict, s: Size) -> list[Table]:
    seen = s["steps"] * s["batch"] * T
    rows = [[r, f"{n['epochs'][r]:.3g}", n[key(r, 0.0)]["final_loss"], final_val(n[key(r, 0.0)]),
             n[key(r, 0.1)]["final_loss"], final_val(n[key(r, 0.1)]),
             final_val(n[key(r, 0.1)]) - final_val(n[key(r, 0.0)])] for r in regimes(s)]
    return [Table(f"{s['layers']} layers, d={s['d']}, {s['steps']} steps ({seen:,} training tokens), Shakespeare "
                  "characters; validation on held-out works",
                  ["data", "epochs", "train loss, p=0", "val loss, p=0", "train loss, p=0.1", "val loss, p=0.1",
                   "val change with dropout"], rows)]


def verdict(n: dict, s: Size, quick: bool = False) -> str:
    fresh, small = regimes(s)
    d_fresh = final_val(n[key(fresh, 0.1)]) - final_val(n[key(fresh, 0.0)])
    d_small = final_val(n[key(small, 0.1)]) - final_val(n[key(small, 0.0)])
    best_small = {p: min(v for _, v in n[key(small, p)]["val"]) for p in RATES}
    return (f"On fresh data dropout changes the validation loss by {d_fresh:+.3f}; on the small slice "
            f"({n['epochs'][small]:.0f} epochs) by {d_small:+.3f}"
            + (": it helps only when the data repeats, as the chapter says."
               if d_small < -0.01 and d_fresh > -0.01 else
               ". The chapter's pattern does not show at this size." if not quick else
               " (the quick size is too short to show the effect).")
            + f" Best validation loss on the slice during training: {best_small[0.0]:.3f} without, "
            f"{best_small[0.1]:.3f} with dropout.")


def draw(n: dict, s: Size):
    """Training and validation losses, with and without dropout, for each kind of data."""
    fig, axes = figure(2, 5.5, 4)
    for ax, regime in zip(axes, regimes(s)):
        for p in RATES:
            r = n[key(regime, p)]
            ax.plot(r["loss"], lw=0.6, alpha=0.6, label=f"train, p={p}")
            ax.plot(*zip(*r["val"]), "o-", label=f"val, p={p}")
        ax.set(xlabel="step", ylabel="loss", title=regime)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size, quick), n, {"dropout": draw(n, size)})
