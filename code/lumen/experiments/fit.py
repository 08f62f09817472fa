"""Training for the experiments: `train_lm` runs lumen's own loop (lumen.train.train) on a model and a
tokenized corpus; `fit` is the small adapter for what that loop does not read, a synthetic task whose
batches come from a function (it reuses lumen.train's optimizer, schedule and step: clip, then AdamW).

    >>> hist = train_lm(model, shakespeare(), steps=200, lr=1e-3)                # doctest: +SKIP
    >>> hist = fit(model, lambda step: task.batch(16), steps=200, lr=1e-3)       # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from ..data import TokenData, prepare
from ..model import GPT
from ..train import TrainConfig, TrainingError, train
from ..train.optim import clip_and_step, lr_at, make_optimizer, set_lr

Batch = tuple[torch.Tensor, torch.Tensor]

# the running experiment's progress bar (lumen.experiments.run sets it): it counts the training steps taken
BAR = None


def _stepped(n: int = 1) -> None:
    if BAR is not None:
        BAR.update(n)


@dataclass
class History:
    """Training loss at every step, validation losses at the evaluations, and time per step."""

    loss: list[float] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)   # (step, validation loss)
    step_seconds: list[float] = field(default_factory=list)
    diverged: bool = False  # the loss became NaN/inf and training stopped

    @property
    def final_loss(self) -> float:
        """Mean training loss over the last 10% of steps (less noisy than the last step)."""
        tail = self.loss[-max(1, len(self.loss) // 10):]
        return float("nan") if self.diverged else sum(tail) / len(tail)

    @property
    def final_val(self) -> float:
        return float("nan") if self.diverged or not self.val else self.val[-1][1]

    @property
    def median_step_seconds(self) -> float:
        return statistics.median(self.step_seconds) if self.step_seconds else float("nan")


def fit(
    model: nn.Module,
    batch: Callable[[int], Batch],
    steps: int,
    lr: float = 1e-3,
    warmup: int = 0,
    min_lr: float | None = None,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    evaluate: Callable[[nn.Module], float] | None = None,
    eval_every: int = 0,
) -> History:
    """AdamW with warm-up then cosine decay (lumen.train.optim) on model(x, y)'s loss for `steps` steps.

    batch(step) gives the step's (inputs, targets); evaluate(model) a validation loss, called every
    `eval_every` steps and at the end. A NaN or inf loss stops training and marks the history diverged."""
    opt = make_optimizer(model, lr, weight_decay, (0.9, 0.95))
    min_lr = lr / 10 if min_lr is None else min_lr
    hist = History()
    model.train()
    for step in range(steps):  # lumen.train.loop's step, on batches from a function
        t0 = time.perf_counter()
        set_lr(opt, lr_at(step, lr, min_lr, warmup, steps))
        x, y = batch(step)
        _, loss = model(x, y)
        if not math.isfinite(loss.item()):
            hist.diverged = True
            break
        loss.backward()
        if not math.isfinite(clip_and_step(opt, model, grad_clip)):
            hist.diverged = True
            break
        hist.step_seconds.append(time.perf_counter() - t0)
        hist.loss.append(loss.item())
        _stepped()
        if evaluate is not None and eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            hist.val.append((step + 1, evaluate(model)))
            model.train()
    if evaluate is not None and not hist.diverged:
        hist.val.append((len(hist.loss), evaluate(model)))
    model.eval()
    return hist


def train_lm(
    model: GPT,
    data: TokenData,
    steps: int,
    lr: float = 1e-3,
    warmup: int = 0,
    batch_size: int = 16,
    seed: int = 0,
    eval_windows: int = 64,
    evals: int = 1,
    train_tokens: int | None = None,
) -> History:
    """Train `model` on a tokenized corpus with lumen's own loop (lumen.train.train: AdamW, warm-up then
    cosine to lr/10, clipping at 1, fp32, nothing saved), and return its History. A NaN/inf loss ends
    the run as diverged. train_tokens: draw windows from only the first train_tokens training tokens
    (a small slice, seen many times); `evals` validations spread over the run (the last at the end)."""
    if train_tokens is not None:
        data = copy.copy(data)   # the same corpus with a shorter training split
        data.splits = {**data.splits, "train": data.splits["train"][:train_tokens]}
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, min_lr=lr / 10, warmup=warmup, seed=seed,
                      eval_interval=max(1, steps // evals), eval_windows=eval_windows, log_interval=1,
                      sample_tokens=0, save=False, progress=False, dtype="float32", device="cpu")
    try:
        result = train(cfg, model=model, data=data)
    except TrainingError:
        return History(diverged=True)
    _stepped(steps)
    hist = History(loss=[r["loss"] for r in result.history if "loss" in r],
                   val=[(r["step"], r["val_loss"]) for r in result.history if "val_loss" in r])
    hist.step_seconds = [batch_size * model.cfg.context / result.tokens_per_s]
    return hist


def shakespeare() -> TokenData:
    """The built-in corpus, character-level, tokenized once into lumen's cache."""
    return prepare("shakespeare", tokenizer="char")


def unigram_loss(data: TokenData) -> float:
    """Validation loss of predicting every character by its training-set frequency (no context at all)."""
    counts = np.bincount(data.tokens("train"), minlength=data.tokenizer.vocab_size) + 1.0
    p = counts / counts.sum()
    val = np.bincount(data.tokens("val"), minlength=len(p))
    return float(-(val * np.log(p)).sum() / val.sum())


def sample_batch(data: TokenData, split: str, batch_size: int, context: int, seed: int) -> Batch:
    """batch_size random windows of a split, drawn from a generator seeded with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return data.batch(split, data.random_starts(split, context, batch_size, gen), context)


def grad_norms(model: GPT, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The gradient norm of each block's parameters after one backward pass of the loss on (x, y)."""
    model.zero_grad(set_to_none=True)
    model.eval()   # no dropout noise in the measurement
    _, loss = model(x, y)
    loss.backward()
    norms = [torch.sqrt(sum(((p.grad.float() ** 2).sum() for p in b.parameters() if p.grad is not None),
                            torch.tensor(0.0))).item()
             for b in model.blocks]
    model.zero_grad(set_to_none=True)
    return norms
