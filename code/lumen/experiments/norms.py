"""Experiment `norms`: LayerNorm against RMSNorm, the same model otherwise: loss, and time per step."""

from __future__ import annotations

import time

import torch

from ..block import LayerNorm, RMSNorm
from ..config import ModelConfig
from .fit import TrainingSize, expect, shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "norms"
CLAIM = ("RMSNorm drops LayerNorm's mean subtraction and bias: it is cheaper (one pass over the vector instead of two) "
         "and trains just as well.")


class Size(TrainingSize):
    norm_reps: int   # timed forward and backward passes of a norm alone


SIZES = {
    False: Size(d=96, layers=4, steps=300, batch=16, lr=2e-3, eval_windows=64, norm_reps=200),
    True: Size(d=48, layers=2, steps=30, batch=8, lr=2e-3, eval_windows=16, norm_reps=20),
}


def norm_seconds(norm: torch.nn.Module, x: torch.Tensor, reps: int) -> float:
    """Median seconds of forward + backward of one norm on x (the norm alone, without the model)."""
    times = []
    for _ in range(reps):
        x1 = x.detach().requires_grad_()
        t = time.perf_counter()
        norm(x1).sum().backward()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def measure(size: Size, seed: int) -> dict:
    """The same model with each norm trained; and each norm's time alone."""
    s = size
    data = shakespeare()
    T = 64
    runs = {}
    expect(2 * s["steps"])
    for norm in ("layernorm", "rmsnorm"):
        cfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=T, d_model=s["d"], n_layers=s["layers"],
                          n_heads=4, activation="gelu", norm=norm)
        torch.manual_seed(seed)
        runs[norm] = train_lm(build(cfg), data, s["steps"], lr=s["lr"], warmup=s["steps"] // 10,
                              batch_size=s["batch"], seed=seed, eval_windows=s["eval_windows"])
    x = torch.randn(s["batch"], T, s["d"], generator=torch.Generator().manual_seed(seed))
    alone = {"layernorm": norm_seconds(LayerNorm(s["d"]), x, s["norm_reps"]),
             "rmsnorm": norm_seconds(RMSNorm(s["d"]), x, s["norm_reps"])}
    numbers: dict = {k: {"val": h.final_val, "final_loss": h.final_loss, "loss": h.loss} for k, h in runs.items()}
    numbers["timing_seconds"] = {k: {"step": runs[k].median_step_seconds, "norm_alone": alone[k]} for k in runs}
    return numbers


NORMS = ("layernorm", "rmsnorm")


def tables(n: dict, s: Size) -> list[Table]:
    t = n["timing_seconds"]
    rows = [[k, n[k]["final_loss"], n[k]["val"], 1000 * t[k]["step"], 1e6 * t[k]["norm_alone"]] for k in NORMS]
    return [Table(f"{s['layers']} layers, d={s['d']}, {s['steps']} steps on Shakespeare (characters)",
                  ["norm", "train loss", "val loss", "ms per training step", "us per norm (fwd+bwd, alone)"], rows)]


def verdict(n: dict, s: Size) -> str:
    t = n["timing_seconds"]
    dv = n["rmsnorm"]["val"] - n["layernorm"]["val"]
    step_ratio = t["rmsnorm"]["step"] / t["layernorm"]["step"]
    return (f"RMSNorm's validation loss is {dv:+.3f} against LayerNorm's"
            + (" (as good, as the chapter says)" if abs(dv) < 0.03 else (" (better)" if dv < 0 else " (worse)"))
            + f"; the norm alone (forward and backward) takes "
            f"{t['rmsnorm']['norm_alone'] / t['layernorm']['norm_alone']:.2f}x LayerNorm's time, a whole training step "
            f"{step_ratio:.2f}x"
            + (" (cheaper, as the chapter says" if step_ratio < 0.97 else " (no faster per step")
            + "; both norms are the chapter's plain PyTorch, not fused kernels, and wall times on a shared CPU "
            "are noisy).")


def draw(n: dict, s: Size):
    """Both models' training losses."""
    fig, (ax,) = figure(1, 6, 4)
    for k in NORMS:
        ax.plot(n[k]["loss"], lw=0.8, label=k)
    ax.set(xlabel="step", ylabel="training loss", title="LayerNorm vs RMSNorm")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"norms": draw(n, size)},
                  ["Times are wall-clock and vary between runs; the losses are deterministic for a seed."])
