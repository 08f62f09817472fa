"""What a run achieved (`TrainResult`), as train() returns it and as `summary.json` records it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..model import GPT
from ..tokenizers import Tokenizer

# the fields of summary.json besides the result's own: how the run was made
SUMMARY_FIELDS = ("final_val_loss", "best_val_loss", "val_loss_per_char", "final_train_loss", "steps", "tokens",
                  "tokens_per_s", "mfu", "wall_time", "stopped", "processes", "parallel", "bf16", "device")


@dataclass
class TrainResult:
    """What a run achieved. Losses are mean cross-entropy in nats per token on the validation split."""

    final_val_loss: float | None
    best_val_loss: float | None
    final_train_loss: float | None
    steps: int  # optimizer steps taken in total (including those before a resume)
    tokens: int  # training tokens seen in total, over all processes
    tokens_per_s: float  # training throughput of this session, evaluations excluded
    mfu: float  # model FLOPs utilisation of this session against the measured matmul peak
    wall_time: float  # seconds this session ran, start to end
    history: list[dict] = field(repr=False)  # every metrics record: {"step", "loss", "lr", ...} and evals
    model: GPT | None = field(default=None, repr=False)  # the trained model (eval mode)
    tokenizer: Tokenizer | None = field(default=None, repr=False)
    run_dir: Path | None = None
    chars_per_token: float = 1.0  # of the validation windows' targets: val loss / this = nats per character
    stopped: str = "done"  # "done", "max_time", or "interrupted"

    @property
    def evals(self) -> list[dict]:
        """The validation records: {"step", "val_loss", "train_loss", "sample"?}."""
        return [r for r in self.history if "val_loss" in r]

    @property
    def val_loss_per_char(self) -> float | None:
        """Validation loss in nats per character: comparable across tokenizers."""
        return None if self.final_val_loss is None else self.final_val_loss / self.chars_per_token

    def summary(self, **how: object) -> dict:
        """summary.json's record: the result's numbers and `how` (processes, parallel, bf16, device)."""
        s = {k: getattr(self, k) for k in SUMMARY_FIELDS if hasattr(self, k)}
        return {**s, **how}


def summary_line(r: TrainResult) -> str:
    val = f"{r.final_val_loss:.4f}" if r.final_val_loss is not None else "n/a"
    best = f"{r.best_val_loss:.4f}" if r.best_val_loss is not None else "n/a"
    per_char = f" ({r.val_loss_per_char:.4f} per character)" if r.chars_per_token != 1.0 and r.final_val_loss else ""
    return (f"lumen train: {r.steps} steps, {r.tokens:,} tokens, final val loss {val}{per_char}, "
            f"best {best}, {r.tokens_per_s:,.0f} tokens/s, MFU {r.mfu:.0%}, "
            f"{r.wall_time:.0f}s" + (", stopped at max_time" if r.stopped == "max_time" else "")
            + (f"; run in {r.run_dir}" if r.run_dir else ""))


def from_summary(s: dict, **rest: object) -> TrainResult | None:
    """The result a summary.json records (None when it is not one lumen wrote)."""
    try:
        kw = {k: s[k] for k in ("final_val_loss", "best_val_loss", "final_train_loss", "steps", "tokens",
                                "tokens_per_s", "mfu", "wall_time", "stopped")}
        per_char = s.get("val_loss_per_char")
        cpt = kw["final_val_loss"] / per_char if per_char and kw["final_val_loss"] else 1.0
        ok = all(isinstance(kw[k], (int, float)) for k in ("steps", "tokens", "tokens_per_s", "mfu", "wall_time"))
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return TrainResult(**kw, chars_per_token=cpt, **rest) if ok else None  # type: ignore[arg-type]
