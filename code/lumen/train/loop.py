"""The training loop: batches in, AdamW steps, validation, samples, checkpoints; resumable bit for bit.

    >>> from lumen.train import TrainConfig, train
    >>> result = train(TrainConfig(steps=200, save=False, progress=False))   # doctest: +SKIP
    >>> result.final_val_loss

One optimizer step reads `grad_accum x batch_size` random windows. They are drawn on every rank from
the same seeded generator (the data position), and rank r trains on its own share of them, so one
process with grad_accum = 2 and two processes with grad_accum = 2 take the same steps.
The run directory and its checkpoints: rundir.py; the machine's settings: machine.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..data import TokenData
from ..decode import Sampling, tokens
from ..errors import ConfigError, TrainingError, UserError
from ..formats import checkpoint as ckpt
from ..model import GPT
from ..progress import progress
from ..runtime import cpu
from ..runtime.compiling import COMPILE_OPTIONS
from ..runtime.threads import ThreadTuner
from . import distributed
from .budget import StepBudget
from .config import TrainConfig, check_memory
from .machine import TrainingInterrupted, resolve_device, run_settings, training_attention, use_bf16
from .optim import clip_and_step, lr_at, make_optimizer, set_lr
from .result import TrainResult, summary_line
from .rundir import RunDir, resume_from
from .speed import Throughput, matmul_peak, training_flops_per_token
from .steps import Loop

__all__ = ["TrainResult", "TrainingError", "TrainingInterrupted", "train", "training_attention"]


def train(cfg: TrainConfig, model_cfg: ModelConfig | None = None, *, resume: bool = False,
          data: TokenData | None = None, model: GPT | None = None) -> TrainResult:
    """Train a GPT and return what it reached.

    cfg: the run (corpus, tokenizer, steps, lr, warmup, batch, eval_interval, seed, save=False for no files
        at all, progress=False for a silent run, ...).
    model_cfg: the architecture; its vocab_size is replaced by the tokenizer's. Default: the `baby-gpt`
        preset. For experiments, e.g. ``ModelConfig.from_name("baby-gpt").replace(norm_placement="post")``.
    resume: continue from the newest intact checkpoint in cfg.out_dir (a fresh start if there is none).
    data: already-prepared token data (skips `prepare`; share one across many runs).
    model: a model to train instead of a fresh one built from model_cfg (its config is used).

    Ctrl-C saves the current step and raises TrainingInterrupted (a KeyboardInterrupt).

        >>> base = ModelConfig.from_name("baby-gpt").replace(n_layers=4, d_model=128, n_heads=4, context=64)
        >>> cfg = TrainConfig(steps=300, save=False, progress=False, eval_interval=100)
        >>> pre, post = (train(cfg, base.replace(norm_placement=p)) for p in ("pre", "post"))  # doctest: +SKIP
    """
    if cfg.save:
        RunDir(cfg.out_dir).check(resume)  # before any process starts anything
    with run_settings(cfg):
        try:
            trainer = Trainer(cfg, model_cfg, data, model)
            # a process of the run that dies takes the others down, in one line (not a hang)
            with distributed.stop_together(trainer.dist, trainer.kept):
                result = trainer.run(resume)
                # every rank has finished (rank 0 has written its files) before any closes its connections; how
                # a torchrun worker then ends its process: distributed.leave
                distributed.barrier(trainer.dist)
            return result
        finally:
            distributed.shutdown()


class Trainer(Loop):
    """One run's state: the model, optimizer, data position and the run directory; its steps go round
    lumen.train.steps.Loop (the loop a sparse dictionary's training shares)."""

    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig | None, data: TokenData | None,
                 model: GPT | None = None):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dist = d = distributed.init(self.device.type)
        if d.active and self.device.type == "cuda":
            self.device = torch.device("cuda", d.local_rank)
        if cfg.grad_accum % d.world:
            raise ConfigError(f"grad_accum ({cfg.grad_accum}) must be a multiple of the number of processes "
                              f"({d.world})")
        self.micro_steps = cfg.grad_accum // d.world  # this rank's micro-batches per step
        self.data = data or cfg.prepare_data(quiet=not (cfg.progress and d.main))
        self.tokenizer = self.data.tokenizer
        self.sample_prompt = cfg.sample_prompt_ids(self.tokenizer)
        model_cfg = model.cfg if model is not None else (model_cfg or ModelConfig.from_name("baby-gpt"))
        self.model_cfg = model_cfg.replace(vocab_size=self.tokenizer.vocab_size)
        if model is not None and model.cfg != self.model_cfg:
            raise UserError(f"the model's vocab_size {model.cfg.vocab_size} differs from the tokenizer's "
                            f"{self.tokenizer.vocab_size}")
        self.T = self.model_cfg.context
        check_memory(cfg, self.model_cfg, self.device)
        self.data.check_context(self.T)
        val_starts = self.data.even_starts("val", self.T, cfg.eval_windows)  # what evaluate() reads
        self.val_chars_per_token = self.data.chars("val", val_starts, self.T) / (len(val_starts) * self.T)

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.raw = (model if model is not None else GPT(self.model_cfg)).to(self.device).train()
        self.bf16 = use_bf16(cfg.dtype, self.device)
        self.sharded = cfg.parallel == "fsdp"  # checkpoints of shards (at any number of processes)
        self.fsdp = self.sharded and d.active  # every rank takes part in every forward pass
        if self.fsdp:
            distributed.shard(self.raw, d, self.device, self.bf16)  # before the optimizer: it steps the shards
        self.opt = make_optimizer(self.raw, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.optimizer,
                                  cfg.muon_lr, ns_steps=cfg.muon_ns_steps)
        self.gen = torch.Generator().manual_seed(cfg.seed)  # the data position: which windows come next
        torch.manual_seed(cfg.seed + 1 + d.rank)  # dropout noise differs per rank
        # torch.compile of a Module returns a Module (OptimizedModule); its stubs say only "a callable"
        self.fwd: nn.Module = self.raw
        if cfg.compile and self.fsdp:  # block by block: FSDP's gathers run between the compiled graphs
            for block in self.raw.blocks:
                block.compile(options=COMPILE_OPTIONS)
        elif cfg.compile:
            self.fwd = torch.compile(self.raw, options=COMPILE_OPTIONS)  # type: ignore[assignment]
        self.ddp = d.active and not self.fsdp
        if self.ddp:
            self.fwd = nn.parallel.DistributedDataParallel(
                self.fwd, device_ids=[d.local_rank] if self.device.type == "cuda" else None)
        super().__init__(RunDir(cfg.out_dir) if cfg.save else None, talks=cfg.progress and d.main,
                         writes=cfg.save and d.main)
        self.last_val: float | None = None

    # the run's settings, as the loop reads them (a run sized by its time budget changes its steps as it goes)
    @property
    def steps(self) -> int:  # type: ignore[override]
        return self.cfg.steps

    @property
    def eval_interval(self) -> int:  # type: ignore[override]
        return self.cfg.eval_interval

    @property
    def log_interval(self) -> int:  # type: ignore[override]
        return self.cfg.log_interval

    @property
    def max_time(self) -> float:  # type: ignore[override]
        return self.cfg.max_time

    @property
    def keep_last(self) -> int:  # type: ignore[override]
        return self.cfg.keep_last

    def run(self, resume: bool) -> TrainResult:
        if self.run_dir is not None:
            self.open_run_dir(resume)  # (a budgeted run resumed takes the step count it chose)
        cfg = self.cfg
        if self.step >= cfg.steps:  # a finished run: nothing to train; report what it recorded
            return self.finished()
        peak = matmul_peak(self.device, torch.bfloat16 if self.bf16 else torch.float32)
        self.speed = Throughput(cfg.windows_per_step * self.T, training_flops_per_token(self.model_cfg, self.T), peak)
        # the bar draws on a terminal only (disable=None); piped into a log, the run still writes its banner,
        # each evaluation's line and the summary
        # (inside an experiment's bar, its steps advance that bar: lumen.progress)
        self.bar = bar = progress(total=cfg.steps, initial=self.step, unit="step", silent=not self.talks)
        if self.talks:
            bar.write(self.banner(self.speed.tokens_per_step), file=sys.stderr)
        t_start = time.perf_counter()
        # threads = 0: measured
        self.tuner = ThreadTuner() if not cfg.threads and self.device.type == "cpu" else None
        # time_budget: the first steps timed, then the step count chosen (while the rate still warms up)
        self.budget = StepBudget(cfg.time_budget, cfg.warmup, self.step) if cfg.time_budget else None
        self.last_loss: float | None = None
        stopped = self.run_steps(bar)
        bar.close()
        result = TrainResult(
            final_val_loss=self.last_val, best_val_loss=self.best if math.isfinite(self.best) else self.last_val,
            final_train_loss=self.last_loss, steps=self.step, tokens=self.tokens, tokens_per_s=self.speed.tokens_per_s,
            mfu=self.speed.mfu, wall_time=time.perf_counter() - t_start, history=self.history, model=self.raw.eval(),
            tokenizer=self.tokenizer, run_dir=self.path, chars_per_token=self.val_chars_per_token, stopped=stopped,
        )
        if self.writes:
            assert self.run_dir is not None  # writes implies cfg.save
            self.run_dir.write_summary(result.summary(processes=self.dist.world, parallel=self.cfg.parallel,
                                                      bf16=self.bf16, device=str(self.device)))
        if self.talks:
            print(summary_line(result), file=sys.stderr)
            print(f"lumen train: on {cpu.machine()}", file=sys.stderr)
        return result

    # the loop's hooks ---------------------------------------------------------------------------
    def timed(self, seconds: float) -> None:
        """The step's time: for the speed, the thread tuner, and a time budget's step count."""
        self.speed.add(seconds)
        if self.tuner is not None:
            self.tuner.record(seconds)
        per_step = self.budget.record(seconds) if self.budget is not None else None
        if self.budget is not None and per_step is not None:
            # every rank chooses from the same mean time, so all take the same steps
            per_step = distributed.mean(torch.tensor(per_step, dtype=torch.float64), self.dist).item()
            self.bar.total = self.choose_steps(self.budget.steps(per_step), per_step).steps
            self.budget = None

    def agree(self, out_of_time: bool, interrupted: bool) -> tuple[bool, bool]:
        """A run's processes stop together: when any is out of time, or interrupted."""
        for_time, at_once = distributed.any_rank(self.dist, out_of_time, interrupted)
        return bool(for_time), bool(at_once)

    def log_extra(self) -> dict:
        return {**self.speed.window(), **({"threads": torch.get_num_threads()} if self.tuner else {})}

    def log_line(self, rec: dict) -> dict[str, str]:
        return {"loss": f"{rec['loss']:.4f}", "tok_s": f"{rec['tokens_per_s']:,.0f}", "mfu": f"{rec['mfu']:.0%}"}

    def choose_steps(self, steps: int, per_step: float) -> TrainConfig:
        """The run's step count chosen for its time budget (train.budget), the evaluations spread over it as
        over the steps given; written into the run's config with the budget spent (a rerun takes these steps)."""
        cfg = self.cfg
        evaluations = max(1, round(cfg.steps / cfg.eval_interval))
        self.cfg = dataclasses.replace(cfg, steps=steps, time_budget=0.0,
                                       eval_interval=max(1, -(-steps // evaluations)))
        if self.writes:
            assert self.run_dir is not None  # writes implies cfg.save
            self.run_dir.start(self.cfg, self.model_cfg, self.tokenizer, self.history)
        if self.talks:
            where = f"{self.path}/config.toml" if self.writes and self.path is not None else "this run only"
            print(f"lumen train: {per_step:.3f} s a step on {cpu.machine()}: {steps:,} steps for about "
                  f"{cfg.time_budget:.0f} s of training (time_budget = {cfg.time_budget:g}; the count written "
                  f"into {where})", file=sys.stderr)
        return self.cfg

    def train_step(self) -> dict:
        """One optimizer step over the global batch; returns its mean loss, lr and gradient norm."""
        cfg, d = self.cfg, self.dist
        lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps, cfg.schedule, cfg.decay)
        set_lr(self.opt, lr)
        starts = self.data.random_starts("train", self.T, cfg.grad_accum * cfg.batch_size, self.gen)
        mine = starts.view(cfg.grad_accum, cfg.batch_size)[d.rank * self.micro_steps:(d.rank + 1) * self.micro_steps]
        loss_sum = torch.zeros((), device=self.device)
        for m, window in enumerate(mine):
            x, y = (t.to(self.device, non_blocking=True) for t in self.data.batch("train", window, self.T))
            # DDP all-reduces gradients after the last micro-batch only; FSDP reduce-scatters after each one, so
            # that no rank ever holds a whole gradient
            last = m == self.micro_steps - 1
            # when self.ddp, fwd is a DistributedDataParallel; its declared type, nn.Module, does not show no_sync
            with contextlib.nullcontext() if last or not self.ddp else self.fwd.no_sync():  # type: ignore[operator]
                with self.autocast(), training_attention(self.raw, cfg.compile, self.bf16):
                    _, loss = self.fwd(x, y)
                (loss / self.micro_steps).backward()  # the mean over micro-batches, accumulated in .grad
            loss_sum += loss.detach()
        loss = distributed.mean(loss_sum / self.micro_steps, d).item()
        if not math.isfinite(loss):
            raise TrainingError(self.bad_loss_message(loss))
        gnorm = clip_and_step(self.opt, self.raw, cfg.grad_clip)
        if not math.isfinite(gnorm):
            raise TrainingError(self.bad_loss_message(gnorm, "gradient norm"))
        self.step += 1
        self.tokens += cfg.windows_per_step * self.T
        self.last_loss = loss
        return {"loss": loss, "lr": lr, "grad_norm": gnorm}

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Mean validation loss over a fixed set of windows spread evenly over the validation split."""
        self.raw.eval()
        starts = self.data.even_starts("val", self.T, self.cfg.eval_windows)
        total = torch.zeros(2, dtype=torch.float64)
        chunks = list(starts[self.dist.rank::self.dist.world].split(self.cfg.batch_size))
        if self.fsdp:  # every rank makes as many forward passes (each gathers the weights): a short one adds one
            most = math.ceil(math.ceil(len(starts) / self.dist.world) / self.cfg.batch_size)
            chunks += [starts[:0]] * (most - len(chunks))
        for chunk in chunks:
            x, y = (t.to(self.device) for t in self.data.batch("val", chunk if len(chunk) else starts[:1], self.T))
            with self.autocast():
                _, loss = self.raw(x, y)
            total += torch.tensor([loss.item() * len(chunk), len(chunk)], dtype=torch.float64)
        total = distributed.total(total, self.dist)
        self.raw.train()
        return {"val_loss": (total[0] / total[1]).item()}

    def sample(self) -> str:
        """Text the model writes after the sample prompt (its own generator: training RNG untouched)."""
        cfg, prompt = self.cfg, self.sample_prompt
        idx = torch.tensor([prompt[-self.T:]], device=self.device)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.raw.eval()
        with self.autocast():
            ids = list(tokens(self.raw, idx, cfg.sample_tokens, Sampling(cfg.temperature, top_p=None), gen,
                              use_cache=idx.size(1) + cfg.sample_tokens <= self.T))
        self.raw.train()
        return self.tokenizer.decode(prompt + [int(t[0]) for t in ids])

    def evaluate_and_save(self, out: dict, bar) -> dict:
        """The validation loss (and a sample of text), recorded and checkpointed."""
        train_loss = out["loss"]
        val = self.evaluate()["val_loss"]
        if not math.isfinite(val):
            raise TrainingError(self.bad_loss_message(val, "validation loss", self.step))
        seconds = time.perf_counter() - self.t0
        rec: dict[str, Any] = {"step": self.step, "val_loss": val, "train_loss": train_loss, "tokens": self.tokens,
                               "time": round(seconds, 2)}
        if self.cfg.sample_tokens and (self.dist.main or self.fsdp):  # sharded: every rank decodes the same text
            sample = self.sample()
            if self.dist.main:
                rec["sample"] = sample
        improved, self.best = val < self.best, min(self.best, val)
        if self.talks:
            cpt = self.val_chars_per_token
            per_char = f" ({val / cpt:.4f} per character)" if cpt != 1.0 else ""
            bar.write(f"step {self.step}: val loss {val:.4f}{per_char}, train loss {train_loss:.4f}, {seconds:.0f} s",
                      file=sys.stderr)
            if "sample" in rec:
                bar.write(rec["sample"].strip("\n") + "\n" + "-" * 40, file=sys.stderr)
        self.record(rec)
        if self.cfg.save:
            self.save(val, improved)
        self.last_val = val
        return rec

    # the run directory (rundir.py) ------------------------------------------------------------
    @property
    def path(self) -> Path | None:
        return self.run_dir.path if self.run_dir is not None else None

    def trainer_state(self) -> dict:
        """What resuming needs besides the weights (a sharded checkpoint keeps the optimizer's tensors in its
        shards, and adds its hyperparameters itself)."""
        rng = distributed.gather_objects(torch.get_rng_state(), self.dist)
        return {"optimizer": {} if self.sharded else self.opt.state_dict(), "step": self.step, "tokens": self.tokens,
                "best": self.best, "data_generator": self.gen.get_state(), "torch_rng": rng,
                "world": self.dist.world, "train_config": json.dumps(self.cfg.to_dict())}

    def save(self, val: float | None, improved: bool) -> Path | None:
        state = self.trainer_state()  # every rank takes part in gathering the RNG states
        path = None
        if self.writes or (self.sharded and self.cfg.save):  # sharded: every rank writes its shards
            meta = {"step": self.step, "val_loss": val, "tokens": self.tokens, "config": self.cfg.to_dict()}
            assert self.run_dir is not None  # saving implies cfg.save
            # (sharded runs are AdamW's: TrainConfig refuses Muon with FSDP)
            shards = self.opt if self.sharded and isinstance(self.opt, torch.optim.Optimizer) else None
            path = self.run_dir.save(self.step, lambda p: self.write_checkpoint(p, meta, state, shards), val,
                                     improved, self.cfg.keep_last, main=self.dist.main)
            if self.writes:
                self.run_dir.plot(self.history, title=f"{self.run_dir.path.name}: {self.model_cfg.name}")
        self.saved = (self.step, path)
        return path

    def write_checkpoint(self, path: Path, meta: dict, state: dict,
                         shards: torch.optim.Optimizer | None = None) -> None:
        """A checkpoint of the model (lumen.formats.checkpoint); sharded: this rank's shards (and rank 0 the
        rest)."""
        if shards is not None:
            ckpt.save_sharded_checkpoint(path, self.raw, shards, self.tokenizer, meta, state)
        else:
            ckpt.save_checkpoint(path, self.raw, self.tokenizer, meta, state)

    def open_run_dir(self, resume: bool) -> None:
        assert self.run_dir is not None
        if self.dist.main:
            self.run_dir.tidy()
        distributed.barrier(self.dist)  # rank 0 tidied half-written checkpoints before anyone reads
        start = self.run_dir.resume_point(say=self.dist.main) if resume else None
        if start is not None:
            state = resume_from(start, self.raw, self.opt, self.cfg, self.model_cfg, self.device)
            self.adopt_chosen_steps(state)
            self.step, self.tokens, self.best = state["step"], state["tokens"], state["best"]
            self.gen.set_state(state["data_generator"])
            if state["world"] == self.dist.world:
                torch.set_rng_state(state["torch_rng"][self.dist.rank])
            self.history = self.run_dir.history(upto=self.step)
            if self.talks:
                print(f"lumen train: resuming from {start} (step {self.step})", file=sys.stderr)
        elif resume:
            self.run_dir.check_same_run(self.cfg, self.model_cfg)  # nothing of another run is overwritten
            if self.talks:
                print(f"lumen train: no checkpoint in {self.path} yet; starting from step 0", file=sys.stderr)
        if self.writes and self.step < self.cfg.steps:
            self.run_dir.start(self.cfg, self.model_cfg, self.tokenizer, self.history)

    def adopt_chosen_steps(self, state: dict) -> None:
        """A budgeted run resumed: the step count it chose when it started (its checkpoint's config), so that it
        ends where the run would have without the break."""
        try:
            saved = json.loads(state.get("train_config", "{}"))
        except (TypeError, ValueError):
            return
        if self.cfg.time_budget and saved.get("time_budget") == 0 and isinstance(saved.get("steps"), int):
            self.cfg = dataclasses.replace(self.cfg, steps=saved["steps"], time_budget=0.0,
                                           eval_interval=saved.get("eval_interval", self.cfg.eval_interval))

    def finished(self) -> TrainResult:
        """A resumed run that has taken all its steps: what summary.json records, re-reported, not rewritten."""
        assert self.run_dir is not None  # a finished run was resumed from its directory
        result = self.run_dir.recorded_result(self.history, self.best, self.val_chars_per_token)
        result.model, result.tokenizer = self.raw.eval(), self.tokenizer
        if self.talks:
            print(f"lumen train: {self.path} is already trained to step {self.step} (steps = {self.cfg.steps}); "
                  f"as recorded:\n{summary_line(result)}", file=sys.stderr)
        return result

    # -----------------------------------------------------------------------------------------
    def banner(self, tokens_per_step: int) -> str:
        n = sum(p.numel() for p in self.raw.parameters())
        emulated = cpu.emulated_bf16() if self.bf16 and self.device.type == "cpu" else None
        return (f"lumen train: {n / 1e6:.2f}M parameters, {self.tokenizer.kind} tokenizer "
                f"({self.tokenizer.vocab_size} tokens), {tokens_per_step:,} tokens/step, "
                f"{'bf16 autocast' if self.bf16 else 'fp32'} on {self.device}"
                f"{f' x {self.dist.world} processes ({self.cfg.parallel})' if self.dist.active else ''}"
                + (", compiled (the first step compiles: ~30 s on a new machine, then cached)"
                   if self.cfg.compile else "")
                + (f"\nlumen train: {emulated}; dtype = \"auto\" trains in fp32 on such a CPU" if emulated else ""))

    def bad_loss_message(self, value: float, what: str = "loss", step: int | None = None) -> str:
        newest = self.run_dir.newest() if self.run_dir is not None else None
        keep = f"the last good checkpoint is {newest}" if newest else "no checkpoint was written yet"
        return (f"the {what} became {value} at step {step or self.step + 1}; training stopped and {keep}. "
                f"Lower lr (now {self.cfg.lr}), raise warmup, or keep grad_clip on")


