"""The loop every lumen training run goes round, whatever it trains: a GPT (loop.Trainer) or a sparse
dictionary of a model's site (lumen.features.train).

    while step < steps:
        one optimizer step                       the trainer's own (train_step)
        a line in metrics.jsonl                  every log_interval steps
        evaluate, checkpoint                     every eval_interval steps, at the last one, when out of time
        Ctrl-C: checkpoint this step, stop       (a second Ctrl-C stops at once)

A kill -9 loses only the steps since the last checkpoint: `--resume` goes on from the newest intact one (the
run directory: rundir.py), and a trainer whose checkpoint holds everything a step reads (weights, optimizer,
data position, random state) takes from there the same steps the run would have taken without the break.

A trainer subclasses Loop and supplies its parts:

    train_step() -> dict            one optimizer step (step += 1, tokens += ...); what to log
    evaluate() -> dict              held-out measures, with "val_loss" (lower is better: the best checkpoint)
    trainer_state() -> dict         what resuming needs besides the weights
    write_checkpoint(path, meta, state)   a checkpoint folder (the weights, the state), written atomically
    restore(path) -> dict           the reverse: weights and optimizer put back, the state returned
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import TrainingError
from ..files import write_text
from .machine import TrainingInterrupted, ctrl_c
from .rundir import METRICS, RunDir


class Loop:
    """One run's steps and what happens around them: the records, the checkpoints, the stops."""

    what = "lumen train"   # the name its messages start with
    # the run's settings, read at every step (a run sized by its time budget sets its steps as it goes)
    steps: int
    eval_interval: int
    log_interval: int
    max_time: float = 0.0
    keep_last: int = 2

    def __init__(self, run_dir: RunDir | None, talks: bool, writes: bool | None = None):
        self.run_dir = run_dir
        self.talks = talks                      # progress and messages on stderr
        self.writes = run_dir is not None if writes is None else writes   # this process writes the records
        self.step, self.tokens, self.best = 0, 0, math.inf
        self.history: list[dict] = []
        self.saved: tuple[int, Path | None] | None = None   # the step this session last saved, and where
        self.t0 = time.perf_counter()           # when the run's clock read 0 (the loop sets it, counting on
        # across a resume from the time its last evaluation recorded)

    # the trainer's parts ----------------------------------------------------------------------------
    def train_step(self) -> dict:
        raise NotImplementedError

    def evaluate(self) -> dict:
        raise NotImplementedError

    def trainer_state(self) -> dict:
        raise NotImplementedError

    def write_checkpoint(self, path: Path, meta: dict, state: dict) -> None:
        raise NotImplementedError

    def restore(self, path: Path) -> dict:
        raise NotImplementedError

    # hooks with a default: a distributed trainer's ranks agree, a GPT run times its steps --------------
    def timed(self, seconds: float) -> None:
        """After each step, the seconds it took."""

    def agree(self, out_of_time: bool, interrupted: bool) -> tuple[bool, bool]:
        """Whether to stop for time, and at once (every process of a run must decide alike)."""
        return out_of_time, interrupted

    def log_line(self, rec: dict) -> dict[str, str]:
        """What the progress bar shows after a logged step."""
        return {"loss": f"{rec['loss']:.4f}"} if isinstance(rec.get("loss"), float) else {}

    def eval_line(self, rec: dict, seconds: float) -> str:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in rec.items() if isinstance(v, float) and k != "time")
        return f"step {self.step}: {shown}, {seconds:.0f} s"

    # the loop ---------------------------------------------------------------------------------------
    def run_steps(self, bar: Any) -> str:
        """Train from self.step to self.steps: "done", or "max_time" when stopped for time. Ctrl-C checkpoints
        the step it finishes and raises TrainingInterrupted. bar: a tqdm bar (update, set_postfix, write)."""
        t_start = time.perf_counter()
        self.t0 = t_start - max((r["time"] for r in self.history if isinstance(r.get("time"), (int, float))),
                                default=0.0)
        with ctrl_c() as interrupted:
            while self.step < self.steps:
                t0 = time.perf_counter()
                out = self.train_step()
                self.timed(time.perf_counter() - t0)
                if self.step % self.log_interval == 0 or self.step == self.steps:
                    rec = {"step": self.step, **out, "tokens": self.tokens, **self.log_extra()}
                    self.record(rec)
                    bar.set_postfix(self.log_line(rec), refresh=False)
                bar.update(1)
                out_of_time = bool(self.max_time) and time.perf_counter() - t_start > self.max_time
                for_time, at_once = self.agree(out_of_time, interrupted.is_set())
                if self.step % self.eval_interval == 0 or self.step == self.steps or for_time:
                    self.evaluate_and_save(out, bar)
                if at_once:
                    bar.close()
                    raise TrainingInterrupted(self.step, self.checkpoint_now())
                if for_time:
                    return "max_time"
        return "done"

    def log_extra(self) -> dict:
        """More fields for a logged step's record (a GPT run: its speed)."""
        return {}

    def evaluate_and_save(self, out: dict, bar: Any) -> dict:
        """Evaluate, record it, checkpoint (the best so far by val_loss is kept)."""
        measured = self.evaluate()
        val = measured["val_loss"]
        if not math.isfinite(val):
            raise TrainingError(self.bad_value_message(val, "validation loss", self.step))
        seconds = time.perf_counter() - self.t0
        rec = {"step": self.step, **measured, "tokens": self.tokens, "time": round(seconds, 2)}
        improved, self.best = val < self.best, min(self.best, val)
        if self.talks:
            bar.write(self.eval_line(measured, seconds), file=sys.stderr)
        self.record(rec)
        if self.run_dir is not None:
            self.save(val, improved)
        return rec

    # records and checkpoints --------------------------------------------------------------------------
    def record(self, rec: dict) -> None:
        self.history.append(rec)
        if self.writes:
            assert self.run_dir is not None  # writes implies a run directory
            self.run_dir.record(rec)

    def save(self, val: float | None, improved: bool) -> Path | None:
        """Checkpoint this step (and drop all but the newest keep_last and the best)."""
        state = self.trainer_state()
        path = None
        if self.writes:
            assert self.run_dir is not None
            meta = {"step": self.step, "val_loss": val, "tokens": self.tokens}
            path = self.run_dir.save(self.step, lambda p: self.write_checkpoint(p, meta, state), val, improved,
                                     self.keep_last)
        self.saved = (self.step, path)
        return path

    def checkpoint_now(self) -> Path | None:
        """The current step as a checkpoint (without an evaluation, unless one just saved it)."""
        if self.run_dir is None:
            return None
        # (decided from what this process saved, not from the folder: every rank of a run decides alike)
        return self.saved[1] if self.saved is not None and self.saved[0] == self.step else self.save(None, False)

    def kept(self) -> str:
        """What a run that stops now keeps, and how to go on (for a message)."""
        newest = self.run_dir.newest() if self.run_dir is not None else None
        return (f"the last checkpoint is {newest}: continue with --resume" if newest is not None else
                "no checkpoint was written yet")

    def resume(self, resume: bool, tidy: bool = True) -> Path | None:
        """Tidy the run directory after a crash and, with resume, go on from its newest intact checkpoint:
        the weights and optimizer (restore), the step, tokens, best and records. Returns the checkpoint."""
        assert self.run_dir is not None
        if tidy:
            self.run_dir.tidy()
        start = self.run_dir.resume_point(say=self.talks) if resume else None
        if start is not None:
            state = self.restore(start)
            self.step, self.tokens, self.best = state["step"], state["tokens"], state["best"]
            self.history = self.run_dir.history(upto=self.step)
            # the steps after the checkpoint were lost: their records go too, to be written again
            write_text(self.run_dir.path / METRICS, "".join(json.dumps(r) + "\n" for r in self.history))
            if self.talks:
                print(f"{self.what}: resuming from {start} (step {self.step})", file=sys.stderr)
        return start

    def bad_value_message(self, value: float, what: str = "loss", step: int | None = None) -> str:
        newest = self.run_dir.newest() if self.run_dir is not None else None
        keep = f"the last good checkpoint is {newest}" if newest else "no checkpoint was written yet"
        return f"the {what} became {value} at step {step or self.step + 1}; training stopped and {keep}"
