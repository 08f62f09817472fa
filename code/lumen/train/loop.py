"""The training loop: batches in, AdamW steps, validation, samples, checkpoints; resumable bit for bit.

    >>> from lumen.train import TrainConfig, train
    >>> result = train(TrainConfig(steps=200, save=False, progress=False))   # doctest: +SKIP
    >>> result.final_val_loss

One optimizer step reads `grad_accum x batch_size` random windows. They are drawn on every rank from
the same seeded generator (the data position), and rank r trains on its own share of them, so one
process with grad_accum = 2 and two processes with grad_accum = 2 take the same steps.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..data import TokenData
from ..errors import TrainingError, UserError
from ..files import write_text
from ..formats import checkpoint as ckpt
from ..model import COMPILE_OPTIONS, GPT, plain_attention
from ..threads import ThreadTuner
from ..tokenizers import Tokenizer
from . import distributed
from .config import TrainConfig, to_toml
from .optim import lr_at, make_optimizer
from .speed import matmul_peak, training_flops_per_token


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
    stopped: str = "done"  # "done" or "max_time"

    @property
    def evals(self) -> list[dict]:
        """The validation records: {"step", "val_loss", "train_loss", "sample"?}."""
        return [r for r in self.history if "val_loss" in r]

    @property
    def val_loss_per_char(self) -> float | None:
        """Validation loss in nats per character: comparable across tokenizers."""
        return None if self.final_val_loss is None else self.final_val_loss / self.chars_per_token


def train(
    cfg: TrainConfig,
    model_cfg: ModelConfig | None = None,
    *,
    resume: bool = False,
    data: TokenData | None = None,
    model: GPT | None = None,
) -> TrainResult:
    """Train a GPT and return what it reached.

    cfg: the run (corpus, tokenizer, steps, lr, warmup, batch, dropout lives in model_cfg, eval_interval,
        seed, save=False for no files at all, progress=False for a silent run, ...).
    model_cfg: the architecture; its vocab_size is replaced by the tokenizer's. Default: the `baby-gpt`
        preset. For experiments, e.g. ``ModelConfig.from_name("baby-gpt").replace(norm_placement="post")``.
    resume: continue from the latest checkpoint in cfg.out_dir (a fresh start if there is none).
    data: already-prepared token data (skips `prepare`; share one across many runs).
    model: a model to train instead of a fresh one built from model_cfg (its config is used).

    Example (an experiment: pre-LN vs post-LN at equal settings):
        >>> base = ModelConfig.from_name("baby-gpt").replace(n_layers=4, d_model=128, n_heads=4, context=64)
        >>> cfg = TrainConfig(steps=300, save=False, progress=False, eval_interval=100)
        >>> pre, post = (train(cfg, base.replace(norm_placement=p)) for p in ("pre", "post"))  # doctest: +SKIP
    """
    with run_settings(cfg):
        try:
            trainer = Trainer(cfg, model_cfg, data, model)
            result = trainer.run(resume)
            # every rank has finished (rank 0 has written its files) before any closes its connections; how a
            # torchrun worker then ends its process: distributed.leave
            distributed.barrier(trainer.dist)
            return result
        finally:
            distributed.shutdown()


class Trainer:
    """One run's state: the model, optimizer, data position and the run directory."""

    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig | None, data: TokenData | None,
                 model: GPT | None = None):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dist = distributed.init(self.device.type)
        if self.dist.active and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        if cfg.grad_accum % self.dist.world:
            raise UserError(
                f"grad_accum ({cfg.grad_accum}) must be a multiple of the number of processes ({self.dist.world})"
            )
        self.micro_steps = cfg.grad_accum // self.dist.world  # this rank's micro-batches per step
        self.data = data or cfg.prepare_data(quiet=not (cfg.progress and self.dist.main))
        self.tokenizer = self.data.tokenizer
        if model is not None:
            model_cfg = model.cfg
        model_cfg = (model_cfg or ModelConfig.from_name("baby-gpt")).replace(vocab_size=self.tokenizer.vocab_size)
        self.model_cfg = model_cfg
        self.T = model_cfg.context
        self.data.check_context(self.T)
        val_starts = self.data.even_starts("val", self.T, cfg.eval_windows)  # what evaluate() reads
        self.val_chars_per_token = self.data.chars("val", val_starts, self.T) / (len(val_starts) * self.T)

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        if model is not None and model.cfg != model_cfg:
            raise UserError(f"the model's vocab_size {model.cfg.vocab_size} differs from the tokenizer's "
                             f"{self.tokenizer.vocab_size}")
        self.raw = (model if model is not None else GPT(model_cfg)).to(self.device)
        self.raw.train()
        self.opt = make_optimizer(self.raw, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), self.device)
        self.gen = torch.Generator().manual_seed(cfg.seed)  # the data position: which windows come next
        torch.manual_seed(cfg.seed + 1 + self.dist.rank)  # dropout noise differs per rank
        self.step, self.tokens, self.best = 0, 0, math.inf
        self.bf16 = use_bf16(cfg.dtype, self.device)
        self.fwd: nn.Module = torch.compile(self.raw, options=COMPILE_OPTIONS) if cfg.compile else self.raw
        if self.dist.active:
            ids = [self.dist.local_rank] if self.device.type == "cuda" else None
            self.fwd = nn.parallel.DistributedDataParallel(self.fwd, device_ids=ids)
        self.run_dir = Path(cfg.out_dir) if cfg.save else None
        self.history: list[dict] = []
        self.writes = cfg.save and self.dist.main

    # ------------------------------------------------------------------------------------------
    def run(self, resume: bool) -> TrainResult:
        cfg, main = self.cfg, self.dist.main
        if self.run_dir is not None:
            self._open_run_dir(resume)
        flops_per_token = training_flops_per_token(self.model_cfg, self.T)
        peak = matmul_peak(self.device, torch.bfloat16 if self.bf16 else torch.float32)
        tokens_per_step = cfg.windows_per_step * self.T
        bar = _progress(cfg.steps, self.step, enabled=cfg.progress and main)
        if cfg.progress and main:
            n = sum(p.numel() for p in self.raw.parameters())
            bar.write(f"lumen train: {n / 1e6:.2f}M parameters, {self.tokenizer.kind} tokenizer "
                      f"({self.tokenizer.vocab_size} tokens), {tokens_per_step:,} tokens/step, "
                      f"{'bf16 autocast' if self.bf16 else 'fp32'} on {self.device}"
                      f"{f' x {self.dist.world} processes' if self.dist.active else ''}"
                      + (", compiled (the first step compiles: ~30 s on a new machine, then cached)"
                         if cfg.compile else ""))
        t_start = time.perf_counter()
        train_time, session_tokens, stopped = 0.0, 0, "done"
        window_t, window_tokens, last_loss, val = time.perf_counter(), 0, None, None
        tuner = ThreadTuner() if not cfg.threads and self.device.type == "cpu" else None  # threads = 0: measured
        while self.step < cfg.steps:
            t0 = time.perf_counter()
            loss, lr, gnorm = self.train_step()
            dt = time.perf_counter() - t0
            if tuner is not None:
                tuner.record(dt)
            train_time += dt
            session_tokens += tokens_per_step
            window_tokens += tokens_per_step
            last_loss = loss
            if self.step % cfg.log_interval == 0 or self.step == cfg.steps:
                now = time.perf_counter()
                tps = window_tokens / max(now - window_t, 1e-9)
                rec = {"step": self.step, "loss": loss, "lr": lr, "grad_norm": gnorm, "tokens": self.tokens,
                       "tokens_per_s": round(tps, 1), "mfu": round(tps * flops_per_token / peak, 4)}
                self._record(rec)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:,.0f}", mfu=f"{rec['mfu']:.0%}", refresh=False)
                window_t, window_tokens = now, 0
            bar.update(1)
            out_of_time = cfg.max_time and self._any_rank(time.perf_counter() - t_start > cfg.max_time)
            if self.step % cfg.eval_interval == 0 or self.step == cfg.steps or out_of_time:
                val = self.evaluate_and_save(loss, bar)
                window_t, window_tokens = time.perf_counter(), 0  # evaluation time is not training time
            if out_of_time:
                stopped = "max_time"
                break
        if val is None:  # resumed a finished run: nothing to train, but report where it stands
            val = self.evaluate()
            if cfg.progress and main:
                bar.write(f"lumen train: {self.run_dir} is already trained to step {self.step}; "
                          f"val loss {val:.4f}")
                if cfg.sample_tokens:
                    bar.write(self.sample().strip("\n"))
        bar.close()
        wall = time.perf_counter() - t_start
        tps = session_tokens / max(train_time, 1e-9)
        result = TrainResult(
            final_val_loss=val, best_val_loss=self.best if math.isfinite(self.best) else val,
            final_train_loss=last_loss, steps=self.step, tokens=self.tokens, tokens_per_s=tps,
            mfu=tps * flops_per_token / peak, wall_time=wall, history=self.history, model=self.raw.eval(),
            tokenizer=self.tokenizer, run_dir=self.run_dir, chars_per_token=self.val_chars_per_token,
            stopped=stopped,
        )
        if self.writes:
            self._write_summary(result)
        if cfg.progress and main:
            print(summary_line(result), file=sys.stderr)
        return result

    def train_step(self) -> tuple[float, float, float]:
        """One optimizer step over the global batch; returns (mean loss, lr, gradient norm)."""
        cfg, d = self.cfg, self.dist
        lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
        for group in self.opt.param_groups:
            group["lr"] = lr
        starts = self.data.random_starts("train", self.T, cfg.grad_accum * cfg.batch_size, self.gen)
        mine = starts.view(cfg.grad_accum, cfg.batch_size)[d.rank * self.micro_steps:(d.rank + 1) * self.micro_steps]
        loss_sum = torch.zeros((), device=self.device)
        for m, window in enumerate(mine):
            x, y = (t.to(self.device, non_blocking=True) for t in self.data.batch("train", window, self.T))
            last = m == self.micro_steps - 1
            # DDP all-reduces gradients after the last micro-batch only
            sync = contextlib.nullcontext() if last or not d.active else self.fwd.no_sync()
            with sync:
                with self.autocast(), training_attention(self.raw, cfg.compile, self.bf16):
                    _, loss = self.fwd(x, y)
                (loss / self.micro_steps).backward()  # the mean over micro-batches, accumulated in .grad
            loss_sum += loss.detach()
        loss = distributed.mean(loss_sum / self.micro_steps, d).item()
        if not math.isfinite(loss):
            raise TrainingError(self._bad_loss_message(loss))
        gnorm = torch.nn.utils.clip_grad_norm_(self.raw.parameters(), cfg.grad_clip or math.inf).item()
        if not math.isfinite(gnorm):
            raise TrainingError(self._bad_loss_message(gnorm, "gradient norm"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += cfg.windows_per_step * self.T
        return loss, lr, gnorm

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss over a fixed set of windows spread evenly over the validation split."""
        self.raw.eval()
        starts = self.data.even_starts("val", self.T, self.cfg.eval_windows)
        mine = starts[self.dist.rank::self.dist.world]
        total = torch.zeros(2, dtype=torch.float64)
        for chunk in mine.split(self.cfg.batch_size):
            x, y = (t.to(self.device) for t in self.data.batch("val", chunk, self.T))
            with self.autocast():
                _, loss = self.raw(x, y)
            total += torch.tensor([loss.item() * len(chunk), len(chunk)], dtype=torch.float64)
        total = distributed.total(total, self.dist)
        self.raw.train()
        return (total[0] / total[1]).item()

    def sample(self) -> str:
        """Text the model writes after the sample prompt (its own generator: training RNG untouched)."""
        cfg = self.cfg
        prompt = self.tokenizer.encode(cfg.sample_prompt) or [self.tokenizer.eos_id or 0]
        idx = torch.tensor([prompt[-self.T:]], device=self.device)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.raw.eval()
        fits = idx.size(1) + cfg.sample_tokens <= self.T
        with self.autocast():
            ids = list(self.raw.stream(idx, cfg.sample_tokens, temperature=cfg.temperature, generator=gen,
                                       use_cache=fits))
        self.raw.train()
        return self.tokenizer.decode(prompt + [int(t[0]) for t in ids])

    def evaluate_and_save(self, train_loss: float, bar) -> float:
        cfg = self.cfg
        val = self.evaluate()
        rec = {"step": self.step, "val_loss": val, "train_loss": train_loss, "tokens": self.tokens}
        if cfg.sample_tokens and self.dist.main:
            rec["sample"] = self.sample()
        improved = val < self.best
        self.best = min(self.best, val)
        if cfg.progress and self.dist.main:
            cpt = self.val_chars_per_token
            per_char = f" ({val / cpt:.4f} per character)" if cpt != 1.0 else ""
            bar.write(f"step {self.step}: val loss {val:.4f}{per_char}, train loss {train_loss:.4f}")
            if "sample" in rec:
                bar.write(rec["sample"].strip("\n") + "\n" + "-" * 40)
        self._record(rec)
        if cfg.save:
            self.save(val, improved)
        return val

    # checkpoints -----------------------------------------------------------------------------
    def trainer_state(self) -> dict:
        rng = distributed.gather_objects(torch.get_rng_state(), self.dist)
        return {
            "optimizer": self.opt.state_dict(), "step": self.step, "tokens": self.tokens, "best": self.best,
            "data_generator": self.gen.get_state(), "torch_rng": rng, "world": self.dist.world,
            "train_config": json.dumps(self.cfg.to_dict()),
        }

    def save(self, val: float, improved: bool) -> None:
        state = self.trainer_state()  # every rank takes part in gathering the RNG states
        if not self.writes:
            return
        name = f"{ckpt.PREFIX}{self.step:06d}"
        path = self.run_dir / ckpt.CHECKPOINTS / name
        meta = {"step": self.step, "val_loss": val, "tokens": self.tokens, "config": self.cfg.to_dict()}
        try:
            ckpt.save_checkpoint(path, self.raw, self.tokenizer, meta, state)
            if improved:
                write_text(self.run_dir / ckpt.BEST, json.dumps({"checkpoint": name, "val_loss": val}))
        except OSError as e:
            kept = [p.name for p in ckpt.checkpoints(self.run_dir)]
            raise TrainingError(
                f"could not save checkpoint {name} ({e.strerror or e}); the previous checkpoints are intact "
                f"({', '.join(kept) or 'none yet'}); free space in {self.run_dir} and rerun with --resume"
            ) from e
        best = ckpt.best_checkpoint(self.run_dir)
        for old in ckpt.checkpoints(self.run_dir)[: -self.cfg.keep_last or None]:
            if old != best and old != path:
                shutil.rmtree(old, ignore_errors=True)
        self._plot()

    def _open_run_dir(self, resume: bool) -> None:
        if self.dist.main:
            ckpt.clean_partial(self.run_dir)
        distributed.barrier(self.dist)
        found = ckpt.checkpoints(self.run_dir)
        if found and not resume:
            raise UserError(
                f"{self.run_dir} already holds checkpoints ({found[-1].name}); continue it with --resume "
                f"or train into another directory (--set out_dir=...)"
            )
        if resume and found:
            self.load(found[-1])
        elif resume and self.cfg.progress and self.dist.main:
            print(f"lumen train: no checkpoint in {self.run_dir} yet; starting from step 0", file=sys.stderr)
        if self.writes:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_text(self.run_dir / "config.toml", to_toml(self.cfg, self.model_cfg))
            self.tokenizer.save(self.run_dir)
            self._rewrite_metrics()

    def load(self, path: Path) -> None:
        """Continue from a checkpoint: weights, optimizer, schedule position, RNG and data position."""
        from safetensors.torch import load_file

        saved = ModelConfig.load(path / ckpt.CONFIG)
        if saved != self.model_cfg:
            raise UserError(f"{path} was trained with another model config; resume with the same [model] settings")
        ckpt.load_weights(self.raw, {k: v.to(self.device) for k, v in load_file(str(path / ckpt.WEIGHTS)).items()},
                          path)
        state = ckpt.load_trainer_state(path)
        self.opt.load_state_dict(state["optimizer"])
        self.step, self.tokens, self.best = state["step"], state["tokens"], state["best"]
        self.gen.set_state(state["data_generator"])
        if state["world"] == self.dist.world:
            torch.set_rng_state(state["torch_rng"][self.dist.rank])
        metrics = self.run_dir / "metrics.jsonl"
        if metrics.is_file():
            self.history = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["step"] <= self.step]
        if self.cfg.progress and self.dist.main:
            print(f"lumen train: resuming from {path} (step {self.step})", file=sys.stderr)

    # records ----------------------------------------------------------------------------------
    def _record(self, rec: dict) -> None:
        self.history.append(rec)
        if self.writes:
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")

    def _rewrite_metrics(self) -> None:
        """metrics.jsonl as of the checkpoint resumed from: records a killed run wrote later are dropped."""
        text = "".join(json.dumps(r) + "\n" for r in self.history)
        write_text(self.run_dir / "metrics.jsonl", text)

    def _plot(self) -> None:
        from .plot import plot_losses

        plot_losses(self.history, self.run_dir / "loss.png", title=f"{self.run_dir.name}: {self.model_cfg.name}")

    def _write_summary(self, r: TrainResult) -> None:
        s = {"final_val_loss": r.final_val_loss, "best_val_loss": r.best_val_loss,
             "val_loss_per_char": r.val_loss_per_char, "final_train_loss": r.final_train_loss, "steps": r.steps,
             "tokens": r.tokens, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu, "wall_time": r.wall_time,
             "stopped": r.stopped, "processes": self.dist.world, "bf16": self.bf16, "device": str(self.device)}
        write_text(self.run_dir / "summary.json", json.dumps(s, indent=1) + "\n")

    def _any_rank(self, flag: bool) -> bool:
        return bool(distributed.total(torch.tensor([float(flag)]), self.dist).item())

    def _bad_loss_message(self, value: float, what: str = "loss") -> str:
        kept = ckpt.checkpoints(self.run_dir) if self.run_dir is not None else []
        keep = f"the last good checkpoint is {kept[-1]}" if kept else "no checkpoint was written yet"
        return (f"the {what} became {value} at step {self.step + 1}; training stopped and {keep}. "
                f"Lower lr (now {self.cfg.lr}), raise warmup, or keep grad_clip on")


def summary_line(r: TrainResult) -> str:
    val = f"{r.final_val_loss:.4f}" if r.final_val_loss is not None else "n/a"
    per_char = f" ({r.val_loss_per_char:.4f} per character)" if r.chars_per_token != 1.0 and r.final_val_loss else ""
    return (f"lumen train: {r.steps} steps, {r.tokens:,} tokens, final val loss {val}{per_char}, "
            f"best {r.best_val_loss:.4f}, {r.tokens_per_s:,.0f} tokens/s, MFU {r.mfu:.0%}, "
            f"{r.wall_time:.0f}s" + (", stopped at max_time" if r.stopped == "max_time" else "")
            + (f"; run in {r.run_dir}" if r.run_dir else ""))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} asked for, but torch sees no CUDA GPU (use device = \"cpu\")")
    return torch.device(name)


@contextlib.contextmanager
def run_settings(cfg: TrainConfig) -> Iterator[None]:
    """The process-wide settings a run changes (torch's threads; deterministic mode when compiled on a CPU),
    restored however the run ends, a failed start included."""
    compiled_on_cpu = cfg.compile and resolve_device(cfg.device).type == "cpu"
    if compiled_on_cpu:
        check_cpp_compiler()
    threads = torch.get_num_threads()
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        with deterministic_algorithms(compiled_on_cpu):
            yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True) -> Iterator[None]:
    """PyTorch's deterministic mode (warn-only) for a while. Compiled, the gradient of the embedding is summed
    with atomic adds in whatever order the threads run; in this mode inductor takes ATen's ordered kernel
    there, so a compiled CPU run repeats bit for bit (~2% slower)."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if on:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def training_attention(model: GPT, compiled: bool, bf16: bool) -> contextlib.AbstractContextManager:
    """The attention path of a training step's forward pass: the plain one when compiled, on a CPU, in bf16,
    for contexts where the attention weights are no bigger than the MLP's hidden activations (h T <= d_ff).
    There PyTorch's flash kernel runs bf16 attention far below the matmul peak (measured without AMX); the
    plain path's two batched products around a fused softmax make the whole step ~12% faster, but keep the
    (B, h, T, T) weights for the backward pass, which grow with the square of the context. In fp32 the flash
    kernel is the faster one."""
    cfg = model.cfg
    plain = (compiled and bf16 and model.lm_head.weight.device.type == "cpu"
             and cfg.n_heads * cfg.context <= cfg.hidden)
    return plain_attention(model) if plain else contextlib.nullcontext()


def check_cpp_compiler() -> None:
    """torch.compile on a CPU writes and builds C++: without a compiler, say so now, in one line."""
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:  # inductor's InvalidCxxCompiler: none of g++, c++, $CXX runs
        raise UserError("compile=true on CPU needs a C++ compiler for torch.compile and none was found: "
                         "install one (apt-get install g++, or set CXX) or set compile=false") from e


def use_bf16(dtype: str, device: torch.device) -> bool:
    """bf16 autocast: asked for, or "auto" on hardware that computes bf16 natively (AVX512-BF16/AMX, recent GPUs)."""
    if dtype != "auto":
        return dtype == "bfloat16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kw: object) -> None: ...
    def close(self) -> None: ...
    def write(self, s: str) -> None:
        print(s, file=sys.stderr)


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)
