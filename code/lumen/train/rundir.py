"""A run's directory and what is kept in it: the checkpoint policy (save, keep the last few and the best,
resume from the newest intact one) and the records (metrics.jsonl, loss.png, summary.json).

    runs/shakespeare/
      config.toml         the full config the run was started with
      tokenizer.json
      metrics.jsonl       one JSON record a line: {"step", "loss", "lr", ...} and {"step", "val_loss", ...}
      checkpoints/step-000500/   see lumen.formats.checkpoint (each with a manifest of checksums; a
                                 parallel = "fsdp" run's hold its ranks' shards)
      best.json           {"checkpoint": "step-000500", "val_loss": ...}
      loss.png, summary.json

Every file is written atomically (lumen.files), except metrics.jsonl, a log that grows a line at a time:
its reader skips a line cut short by a crash.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule

from ..config import ModelConfig
from ..errors import CheckpointError, ConfigError, LumenError, TrainingError, UserError
from ..files import atomic_dir, check_writable, read_json, recover_dir, write_text
from ..formats import checkpoint as ckpt
from ..model import GPT
from ..tokenizers import Tokenizer
from .config import TrainConfig, load_config, to_toml
from .optim import Optimizer
from .result import TrainResult, from_summary

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
RUN_FILES = ("config.toml", "tokenizer.json", "tokenizer_config.json", METRICS, SUMMARY, "loss.png", "best.json")


class RunDir:
    """The folder of one run (rank 0 writes it; every rank reads it)."""

    def __init__(self, path: str | Path, needs: tuple[str, ...] = ()):
        """needs: the files a complete checkpoint of this run holds (default: a GPT's, lumen.formats.checkpoint;
        a sparse dictionary's run names its own)."""
        self.path = Path(path)
        self.needs = needs

    def complete(self, checkpoint: Path) -> bool:
        """Whether a step folder holds a whole checkpoint (its manifest is checked only on resuming)."""
        if not self.needs:
            return ckpt.is_checkpoint(checkpoint)
        return all((checkpoint / name).is_file() for name in self.needs)

    def checkpoints(self) -> list[Path]:
        """The run's complete checkpoints, oldest first."""
        return [p for p in ckpt.step_folders(self.path) if self.complete(p)]

    def best(self) -> Path | None:
        """The checkpoint best.json names, if it is still there."""
        try:
            path = self.path / ckpt.CHECKPOINTS / str(read_json(self.path / ckpt.BEST, "best checkpoint")["checkpoint"])
        except (LumenError, KeyError, TypeError):
            return None
        return path if path.parent == self.path / ckpt.CHECKPOINTS and self.complete(path) else None

    def check(self, resume: bool) -> None:
        """Before anything starts: the run's folder can be written (no part of it a file, no file of the run a
        folder), and a fresh run never writes over another run's checkpoints."""
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"out_dir {self.path} is a file, not a folder; set out_dir to a new folder")
        check_writable(self.path, "out_dir", error=ConfigError)
        for name in RUN_FILES:
            kind = ckpt.file_kind(self.path / name)
            if kind == "a folder":
                raise ConfigError(f"out_dir {self.path}: {self.path / name} is a folder where the run writes its "
                                  f"{name}; move it away or set out_dir to another folder")
            if kind not in (None, "missing"):  # (a FIFO, opened, would wait for a writer forever)
                raise ConfigError(f"out_dir {self.path}: {self.path / name} is {kind} where the run keeps its "
                                  f"{name}; move it away or set out_dir to another folder")
        if (self.path / ckpt.CHECKPOINTS).exists() and not (self.path / ckpt.CHECKPOINTS).is_dir():
            raise ConfigError(f"out_dir {self.path}: {self.path / ckpt.CHECKPOINTS} is a file where the run keeps "
                              "its checkpoints; move it away or set out_dir to another folder")
        found = [p for p in (self.path / ckpt.CHECKPOINTS).glob(f"{ckpt.PREFIX}*") if ckpt.step_of(p) is not None]
        if found and not resume:
            newest = max(found, key=ckpt.step_key)
            raise UserError(
                f"{self.path} already holds checkpoints ({newest.name}); continue it with --resume "
                f"or train into another directory (--set out_dir=...)"
            )
        if not resume and (self.path / METRICS).exists():
            raise UserError(f"{self.path} already holds a run ({METRICS}, config.toml) stopped before its first "
                            f"checkpoint; start it again with --resume (its own settings only) or train into another "
                            f"directory (--set out_dir=...)")

    def check_same_run(self, cfg: TrainConfig, model_cfg: ModelConfig) -> None:
        """--resume where no checkpoint was written yet: the run this folder records (config.toml) is the one
        asked for, or nothing of it is overwritten."""
        recorded = self.path / "config.toml"
        if not (self.path / METRICS).exists() or not recorded.exists():
            return
        try:
            saved, saved_model = load_config(recorded)
        except LumenError as e:
            raise ConfigError(f"{self.path} holds a run whose settings cannot be read ({e}), so it cannot be told "
                              f"from this one; train into another directory (--set out_dir=...)") from None
        same_run(self.path, saved.to_dict(), saved_model.to_dict(), cfg, model_cfg)

    def tidy(self) -> None:
        """After a crash: drop half-written checkpoints; put back one that was being replaced."""
        recover_dir(self.path / ckpt.CHECKPOINTS, self.complete)

    def resume_point(self, say: bool) -> Path | None:
        """The newest intact checkpoint (None if there is none at all); damaged newer ones are named and
        passed over."""
        found = [p for p in (self.path / ckpt.CHECKPOINTS).glob(f"{ckpt.PREFIX}*") if ckpt.step_of(p) is not None]
        damaged = []
        for path in sorted(found, key=ckpt.step_key, reverse=True):
            try:
                ckpt.verify(path, self.needs)
            except CheckpointError as e:
                damaged.append(f"{path.name} ({e})")
                continue
            if damaged and say:
                print(f"lumen train: skipping damaged checkpoint(s) {'; '.join(damaged)}; resuming from "
                      f"{path.name}", file=sys.stderr)
            return path
        if damaged:
            raise CheckpointError(f"{self.path} has no intact checkpoint to resume from: {'; '.join(damaged)}; "
                                  f"train afresh into another out_dir")
        return None

    def start(self, cfg: TrainConfig, model_cfg: ModelConfig, tokenizer: Tokenizer, history: list[dict]) -> None:
        """Write the run's config and tokenizer, and metrics.jsonl as of the step the run starts from."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"out_dir {self.path} cannot be made ({e.strerror or e}); set out_dir to a folder "
                              f"you can write") from None
        write_text(self.path / "config.toml", to_toml(cfg, model_cfg))
        with atomic_dir(self.path / ".tokenizer") as tmp:
            tokenizer.save(tmp)
        for f in (self.path / ".tokenizer").iterdir():  # moved out of the complete folder: each file whole
            f.replace(self.path / f.name)
        shutil.rmtree(self.path / ".tokenizer", ignore_errors=True)
        write_text(self.path / METRICS, "".join(json.dumps(r) + "\n" for r in history))

    def history(self, upto: int) -> list[dict]:
        """metrics.jsonl's records up to step `upto` (a line cut short or damaged is skipped)."""
        try:
            lines = (self.path / METRICS).read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and isinstance(r.get("step"), int) and r["step"] <= upto:
                records.append(r)
        return records

    def record(self, rec: dict) -> None:
        with open(self.path / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")

    def save(self, step: int, write: Callable[[Path], object], val: float | None, improved: bool, keep_last: int,
             main: bool = True) -> Path:
        """Write checkpoint step-N with write(path) (which writes a folder atomically: a GPT's through
        lumen.formats.checkpoint, a dictionary's through lumen.features.train) and best.json if it improved,
        then drop all but the newest `keep_last` and the best among those up to this step. A sharded
        checkpoint is written by every rank (each its shards); `main`, rank 0, writes the rest and the records."""
        name = f"{ckpt.PREFIX}{step:06d}"
        path = self.path / ckpt.CHECKPOINTS / name
        try:
            write(path)
            if improved and main:
                write_text(self.path / ckpt.BEST, json.dumps({"checkpoint": name, "val_loss": val}))
        except OSError as e:
            kept = [p.name for p in self.checkpoints()]
            raise TrainingError(
                f"could not save checkpoint {name} ({e.strerror or e}); the previous checkpoints are intact "
                f"({', '.join(kept) or 'none yet'}); free space in {self.path} and rerun with --resume"
            ) from e
        if not main:
            return path
        best = self.best()
        upto = [p for p in self.checkpoints() if ckpt.step_key(p) <= step]
        for old in upto[: -keep_last or None]:
            if old != best and old != path:
                shutil.rmtree(old, ignore_errors=True)
        return path

    def newest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def summary(self) -> dict | None:
        """What summary.json records (None if missing or unreadable)."""
        try:
            return read_json(self.path / SUMMARY, "run summary", TrainingError)
        except LumenError:
            return None

    def recorded_result(self, history: list[dict], best: float, chars_per_token: float) -> TrainResult:
        """The result of a finished run as summary.json records it; if the run was stopped before writing
        it, as its metrics record it (and summary.json is written now)."""
        result = from_summary(self.summary() or {}, history=history, run_dir=self.path)
        if result is not None:
            return result
        evals = [r for r in history if "val_loss" in r]
        logs = [r for r in history if "loss" in r]
        last, val = logs[-1] if logs else {}, evals[-1]["val_loss"] if evals else None
        result = TrainResult(val, best if math.isfinite(best) else val, last.get("loss"), last.get("step", 0),
                             last.get("tokens", 0), last.get("tokens_per_s", 0.0), last.get("mfu", 0.0), 0.0,
                             history, run_dir=self.path, chars_per_token=chars_per_token)
        self.write_summary(result.summary())
        return result

    def write_summary(self, summary: dict) -> None:
        write_text(self.path / SUMMARY, json.dumps(summary, indent=1) + "\n")

    def plot(self, history: list[dict], title: str) -> None:
        from .plot import plot_losses

        plot_losses(history, self.path / "loss.png", title=title)


# The settings that may change from one session of a run to the next: where and how fast it runs, what it
# reports and keeps. Every other setting defines the run (its data, its model, each step it takes), and --resume
# continues a run only with its own.
SESSION_KEYS = frozenset({"device", "compile", "threads", "parallel", "out_dir", "log_interval", "eval_interval",
                          "eval_windows", "sample_tokens", "sample_prompt", "temperature", "save", "keep_last",
                          "progress", "max_time"})


def differences(saved: dict, now: dict, ignore: frozenset[str] = SESSION_KEYS) -> list[str]:
    """The settings that define a run where the run's (saved) and the asked-for (now) differ, as
    `key = saved (now: value)`. A run sized by time (time_budget) chose its step count as it started and
    recorded it with the budget spent (0): asked for again with a budget, that count is the run's own."""
    if (now.get("time_budget") or 0) > 0 and saved.get("time_budget") == 0:
        ignore = ignore | {"steps", "time_budget"}
    return [f"{k} = {_plain(saved[k])!r} (now: {_plain(now[k])!r})" for k in now
            if k in saved and k not in ignore and _plain(saved[k]) != _plain(now[k])]


def _plain(value: object) -> object:
    """A setting as JSON holds it (a tuple is a list), for comparing one read back with one given."""
    return json.loads(json.dumps(value))


def same_run(where: Path, saved: dict, saved_model: dict, cfg: TrainConfig, model_cfg: ModelConfig) -> None:
    """The run recorded at `where` (its settings and model config) is the run asked for, else UserError naming
    the differences. (vocab_size is the tokenizer's, which the settings name.)"""
    model = differences(saved_model, model_cfg.to_dict(), frozenset({"vocab_size"}))
    if model:
        raise UserError(f"{where} was trained with another model config ({'; '.join(model[:4])}); resume with the "
                        f"same [model] settings, or train into another directory (--set out_dir=...)")
    changed = differences(saved, cfg.to_dict())
    if changed:
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise UserError(f"{where} was trained with other settings ({'; '.join(changed[:4])}{more}): --resume "
                        f"continues a run with its own settings only; give those, or train into another directory "
                        f"(--set out_dir=...)")


def resume_from(path: Path, model: GPT, opt: Optimizer, cfg: TrainConfig, model_cfg: ModelConfig,
                device: torch.device) -> dict:
    """Put a checkpoint's weights into the model being trained and its state into the optimizer, once the run's
    settings are found to be the ones asked for; return the rest of the trainer state. A whole-weights
    checkpoint is read as every format is (checked by GPT.from_state); a sharded one by load_sharded, at any
    number of processes (every rank calls this)."""
    state = ckpt.load_trainer_state(path)
    try:
        saved = json.loads(state["train_config"])
    except ValueError:
        saved = None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path / ckpt.TRAINER}: the settings it records are damaged; resume from an "
                              f"earlier checkpoint")
    saved_model = ModelConfig.load(path / ckpt.CONFIG)
    same_run(path.parent.parent, saved, saved_model.to_dict(), cfg, model_cfg)
    if saved_model.vocab_size != model_cfg.vocab_size:  # the same settings, but the corpus's text has changed
        raise UserError(f"{path} was trained with a tokenizer of {saved_model.vocab_size} tokens, this run's has "
                        f"{model_cfg.vocab_size} (its corpus changed?); resume with the run's own corpus, or train "
                        f"into another directory (--set out_dir=...)")
    groups = _group_kinds(opt)
    if ckpt.is_sharded(path):
        if not isinstance(opt, torch.optim.Optimizer):  # (TrainConfig refuses Muon with FSDP)
            raise ConfigError(f"{path} is a sharded checkpoint of an AdamW run; resume it with optimizer = \"adamw\"")
        ckpt.load_sharded(path, model, opt, state["optimizer"].get("param_groups", []))
    else:
        if isinstance(model, FSDPModule):
            raise UserError(f"{path} holds whole weights (a parallel = \"ddp\" run); resume it with parallel = "
                            f"\"ddp\" (a sharded checkpoint resumes either way)")
        weights = ckpt.read_run(path)
        model.load_state_dict(GPT.from_state(weights.cfg, weights.state, weights.source, device).state_dict())
        try:
            opt.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"{path / ckpt.TRAINER}: its optimizer state does not fit this model ({e})") from None
    if _group_kinds(opt) != groups:  # a damaged trainer.pt can drop a setting AdamW's step reads (KeyError: 'eps')
        raise CheckpointError(f"{path / ckpt.TRAINER}: its optimizer settings are damaged (not those of this run's "
                              f"optimizer); resume from an earlier checkpoint")
    return state


def _group_kinds(opt: Optimizer) -> list[dict[str, str]]:
    """The optimizer's groups as the names and kinds of their settings (a number, a tuple, ...)."""
    return [{k: "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
             for k, v in g.items()} for g in opt.param_groups]
