"""Training for the experiments: `train_lm` runs lumen's own loop (lumen.train.train) on a model and a
tokenized corpus, or a synthetic task in a corpus's shape (TaskData: windows drawn from a function).

    >>> hist = train_lm(model, shakespeare(), steps=200, lr=1e-3)                # doctest: +SKIP
    >>> hist = train_lm(model, TaskData(task.sequence, 18, 16), steps=200)      # doctest: +SKIP
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import torch

from ..data import TokenData, prepare
from ..errors import UserError
from ..model import GPT
from ..tokenizers import CharTokenizer
from ..train import TrainConfig, TrainingError, train

Batch = tuple[torch.Tensor, torch.Tensor]

class TrainingSize(TypedDict):
    """What every experiment that trains small models on Shakespeare sizes (its Size adds its own fields)."""

    d: int              # the models' width
    layers: int         # and depth
    steps: int          # training steps
    batch: int          # windows per step
    lr: float           # peak learning rate
    eval_windows: int   # validation windows


# the running experiment's progress bar (lumen.experiments.run sets it): it counts the training steps taken,
# each training run's own bar advancing it step by step (lumen.progress), out of the steps `expect` declared
BAR = None


def expect(steps: int) -> None:
    """Declare training steps the running experiment will take (all its runs, before the first): the bar's
    total, so its estimate is the steps left at the rate this machine has trained so far."""
    if BAR is not None:
        BAR.total = (BAR.total or 0) + steps
        BAR.refresh()


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


class TaskData(TokenData):
    """A synthetic task in the shape of a tokenized corpus, so that lumen's training loop (lumen.train.train)
    reads it as it reads Shakespeare: each window is sample(generator) -> (inputs, targets), each (context,),
    drawn from a generator seeded by the window's start. The loop's own data position draws the starts, so a
    seed repeats a run; the validation windows are a fixed set of their own. One character per token.

        >>> data = TaskData(lambda gen: task.sequence(gen), vocab_size=18, context=16)   # doctest: +SKIP
    """

    VAL = 2**40   # validation windows' seeds start here (the training windows' lie below)

    def __init__(self, sample: Callable[[torch.Generator], Batch], vocab_size: int, context: int):
        self.sample, self.context = sample, context
        self.tokenizer = CharTokenizer([chr(0x100 + i) for i in range(vocab_size)])

    def check_context(self, context: int) -> None:
        if context != self.context:
            raise UserError(f"this task's windows are {self.context} tokens; the model's context is {context}")

    def batch(self, split: str, starts: torch.Tensor, context: int) -> Batch:
        pairs = [self.sample(torch.Generator().manual_seed(int(s))) for s in starts]
        return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])

    def random_starts(self, split: str, context: int, count: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(self.VAL, (count,), generator=generator)

    def even_starts(self, split: str, context: int, count: int) -> torch.Tensor:
        return self.VAL + torch.arange(count)

    def chars(self, split: str, starts: torch.Tensor, context: int) -> int:
        return len(starts) * context


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
    """Train `model` on a tokenized corpus (or a TaskData) with lumen's own loop (lumen.train.train: AdamW, warm-up then
    cosine to lr/10, clipping at 1, fp32, nothing saved), and return its History. A NaN/inf loss ends
    the run as diverged. train_tokens: draw windows from only the first train_tokens training tokens
    (a small slice, seen many times); `evals` validations spread over the run (the last at the end)."""
    if train_tokens is not None:
        data = copy.copy(data)   # the same corpus with a shorter training split
        data.splits = {**data.splits, "train": data.splits["train"][:train_tokens]}
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, min_lr=lr / 10, warmup=warmup, seed=seed,
                      eval_interval=max(1, steps // evals), eval_windows=eval_windows, log_interval=1,
                      sample_tokens=0, save=False, progress=False, dtype="float32", device="cpu")
    before = BAR.n if BAR is not None else 0
    try:
        result = train(cfg, model=model, data=data)
    except TrainingError:
        if BAR is not None and BAR.total is not None:   # the steps it will not take leave the bar's total
            BAR.total -= steps - (BAR.n - before)
        return History(diverged=True)
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
