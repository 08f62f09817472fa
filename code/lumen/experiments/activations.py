"""Experiment `activations`: ReLU, GELU, SiLU and SwiGLU in the MLP at equal parameter count, and how many
ReLU units are dead (never positive on a batch)."""

from __future__ import annotations

import torch

from .. import names
from ..config import ModelConfig
from ..inspect import run_with_cache
from .fit import TrainingSize, expect, sample_batch, shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "activations"
CLAIM = ("ReLU's hard corner gives exactly zero gradient below zero, so units can get stuck (dead); GELU and SiLU are "
         "smooth and train a little more smoothly; in practice the three give similar results. SwiGLU with "
         "d_ff = 8/3 d has the same parameters as a 4d MLP.")


class Size(TrainingSize):
    dead_batch: int   # validation windows on which a ReLU unit that is never positive counts as dead


SIZES = {
    False: Size(d=96, layers=3, steps=300, batch=16, lr=2e-3, eval_windows=64, dead_batch=64),
    True: Size(d=48, layers=2, steps=30, batch=8, lr=2e-3, eval_windows=16, dead_batch=16),
}
# label -> (mlp kind, activation, hidden width as a multiple of d): 2 d (4d) = 3 d (8/3 d) weights each
VARIANTS = {"ReLU": ("mlp", "relu", 4), "GELU": ("mlp", "gelu", 4), "SiLU": ("mlp", "silu", 4),
            "SwiGLU": ("swiglu", "silu", 8 / 3)}


@torch.no_grad()
def dead_fraction(model, x: torch.Tensor) -> float:
    """The fraction of MLP hidden units (all layers) that are never positive on any token of the batch x."""
    hidden = [names.activation(i, "mlp_hidden") for i in range(len(model.blocks))]
    _, cache = run_with_cache(model, x, hidden)
    alive = [(cache[n] > 0).flatten(0, -2).any(0) for n in hidden]   # per unit: positive somewhere
    return 1 - torch.cat(alive).float().mean().item()


def measure(size: Size, seed: int) -> dict:
    """Each MLP variant trained: its parameters, losses, and (ReLU) dead units before and after."""
    s = size
    data = shakespeare()
    T, d = 64, s["d"]
    x, _ = sample_batch(data, "val", s["dead_batch"], T, seed)
    found = {}
    expect(len(VARIANTS) * s["steps"])
    for label, (mlp, act, mult) in VARIANTS.items():
        cfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=T, d_model=d, n_layers=s["layers"], n_heads=4,
                          mlp=mlp, activation=act, d_ff=round(mult * d), bias=False)
        torch.manual_seed(seed)
        model = build(cfg)
        dead0 = dead_fraction(model, x) if act == "relu" and mlp == "mlp" else None
        params = sum(p.numel() for p in model.parameters())
        hist = train_lm(model, data, s["steps"], lr=s["lr"], warmup=s["steps"] // 10, batch_size=s["batch"],
                        seed=seed, eval_windows=s["eval_windows"])
        dead1 = dead_fraction(model, x) if dead0 is not None else None
        found[label] = {"params": params, "val": hist.final_val, "final_loss": hist.final_loss, "dead_init": dead0,
                        "dead_trained": dead1, "loss": hist.loss}
    return found


def tables(n: dict, s: Size) -> list[Table]:
    rows = [[k, r["params"], r["final_loss"], r["val"], "" if r["dead_init"] is None else r["dead_init"],
             "" if r["dead_trained"] is None else r["dead_trained"]] for k, r in n.items()]
    return [Table(f"{s['layers']} layers, d={s['d']}, {s['steps']} steps on Shakespeare (characters), no biases",
                  ["MLP", "parameters", "train loss", "val loss", "dead ReLU units at init", "dead after training"],
                  rows)]


def verdict(n: dict, s: Size) -> str:
    vals = {k: r["val"] for k, r in n.items()}
    best, worst = min(vals, key=vals.__getitem__), max(vals, key=vals.__getitem__)
    relu = n["ReLU"]
    same_params = len({r["params"] for r in n.values()}) == 1
    return (f"Validation losses span {vals[worst] - vals[best]:.3f} nats (best {best} {vals[best]:.3f}, worst "
            f"{worst} {vals[worst]:.3f})"
            + (": the activations give similar results, as the chapter says" if vals[worst] - vals[best] < 0.05
               else "")
            + f". Dead ReLU units: {relu['dead_init']:.1%} at init, {relu['dead_trained']:.1%} after training"
            + (" (few: dead units need higher learning rates or longer training than this budget to appear)"
               if relu["dead_trained"] < 0.05 else "")
            + (". All four have exactly the same parameter count." if same_params else
               ". (SwiGLU's 8/3 d is rounded, so counts differ slightly.)"))


def draw(n: dict, s: Size):
    """Each variant's training loss, and the validation losses side by side."""
    vals = {k: r["val"] for k, r in n.items()}
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for k, r in n.items():
        ax1.plot(r["loss"], lw=0.8, label=k)
    ax1.set(xlabel="step", ylabel="training loss", title="training loss")
    ax2.bar(list(vals), list(vals.values()))
    ax2.set(ylabel="validation loss", title="validation loss",
            ylim=(min(vals.values()) - 0.1, max(vals.values()) + 0.05))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend()
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"activations": draw(n, size)})
