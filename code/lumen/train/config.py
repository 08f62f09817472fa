"""What a training run does, as one dataclass, read from TOML files and `--set key=value` overrides.

A config file is flat TOML for the run, with a `[model]` table: a preset to start from and any
ModelConfig fields to change (vocab_size comes from the tokenizer).

    corpus = "shakespeare"
    tokenizer = "char"
    steps = 3000
    lr = 2e-3
    [model]
    preset = "baby-gpt"
    n_layers = 4

    >>> cfg, model_cfg = load_config(preset="shakespeare", sets=["steps=100", "model.n_layers=2"])
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..accounting import count
from ..config import ModelConfig
from ..data import TokenData, prepare
from ..errors import ConfigError, LumenError, MissingFileError
from ..files import read_toml
from ..runtime.threads import check_threads
from ..tokenizers import Tokenizer
from .budget import MIN_WARMUP
from .machine import resolve_device
from .optim import OPTIMIZERS, SCHEDULES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# how processes started by torchrun share a run: DistributedDataParallel or fully sharded (FSDP2)
PARALLEL = ("ddp", "fsdp")
MAX_SAMPLE_TOKENS = 2**16  # the longest sample text a run writes at each evaluation


@dataclass
class TrainConfig:
    """One training run. Every field is a TOML key; `model` settings live in the [model] table."""

    # data
    corpus: str | list[str] = "shakespeare"  # built-in name, or files / directories / globs
    tokenizer: str = "char"  # char | byte | bpe | smollm2 | path of a tokenizer.json
    vocab_size: int = 2048  # for tokenizer = "bpe"
    validation: list[str] = field(default_factory=list)  # documents held out; [] = the corpus default
    val_fraction: float = 0.1  # when no documents are named (Shakespeare holds out five fixed works)
    # optimisation
    steps: int = 2000  # optimizer steps
    # seconds of training to aim for: the first steps are timed and `steps` chosen (and written into the run's
    # config, this set to 0) for about this long on this machine (train.budget); 0 = `steps` as given
    time_budget: float = 0.0
    batch_size: int = 32  # windows per micro-batch, per process
    grad_accum: int = 1  # micro-batches per step, over all processes (a multiple of their number)
    optimizer: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest: train.optim)
    lr: float = 1e-3  # peak learning rate (AdamW's)
    muon_lr: float = 0.02  # Muon's peak rate, for optimizer = "muon"
    muon_ns_steps: int = 5  # Muon's Newton-Schulz iterations a step (torch.optim.Muon's ns_steps)
    schedule: str = "cosine"  # cosine | wsd (warm-up, stable, decay)
    decay: float = 0.3  # wsd: the fraction of the steps after warm-up spent going down to min_lr
    min_lr: float = 1e-4  # where the schedule ends
    warmup: int = 100  # steps of linear warm-up from 0
    weight_decay: float = 0.1  # AdamW's, on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = off
    # machine
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 where supported) | float32 | bfloat16
    compile: bool = False  # torch.compile the model
    threads: int = 0  # torch CPU threads; 0 = chosen as the run goes (lumen.runtime.threads), N pins N
    parallel: str = "ddp"  # under torchrun: ddp (a whole copy per process) | fsdp (sharded: lumen.train.distributed)
    seed: int = 1337
    # watching and keeping
    out_dir: str = "runs/run"
    log_interval: int = 10  # steps between progress/metrics lines
    eval_interval: int = 250  # steps between validations (and samples, and checkpoints)
    eval_windows: int = 200  # validation windows, spread evenly over the validation split
    sample_tokens: int = 300  # tokens of sample text at each evaluation; 0 = none
    sample_prompt: str = "\n"
    temperature: float = 0.8
    save: bool = True  # checkpoints, metrics.jsonl, the loss plot, summary.json
    keep_last: int = 2  # checkpoints kept besides the best
    progress: bool = True  # the tqdm progress bar and printed samples
    max_time: float = 0.0  # stop (and save) after this many seconds; 0 = run all steps

    def __post_init__(self) -> None:
        check_types(self)
        for f in ("lr", "muon_lr", "decay", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip", "val_fraction",
                  "temperature", "max_time", "time_budget"):
            if not math.isfinite(getattr(self, f)):
                raise ConfigError(f"{f} must be a finite number, got {getattr(self, f)}")
        positive = ("steps", "batch_size", "grad_accum", "log_interval", "eval_interval", "eval_windows", "vocab_size")
        for f in positive:
            if getattr(self, f) <= 0:
                raise ConfigError(f"{f} must be positive, got {getattr(self, f)}")
        for f in ("lr", "min_lr", "weight_decay", "grad_clip", "warmup", "keep_last", "threads", "max_time",
                  "time_budget", "sample_tokens", "temperature"):
            if getattr(self, f) < 0:
                raise ConfigError(f"{f} must be >= 0, got {getattr(self, f)}")
        if self.time_budget and self.warmup < MIN_WARMUP:
            raise ConfigError(f"time_budget times the first steps while the learning rate warms up (so that the "
                              f"chosen step count is the run's from its start): warmup must be at least "
                              f"{MIN_WARMUP}, got {self.warmup} (or set time_budget = 0 and give steps)")
        if self.lr == 0:
            raise ConfigError("lr must be positive, got 0 (a run that cannot learn)")
        if self.lr * self.weight_decay >= 1:  # AdamW shrinks each matrix by (1 - lr weight_decay) per step
            raise ConfigError(f"weight_decay ({self.weight_decay}) times lr ({self.lr}) must be below 1: each step "
                              f"multiplies the weights by 1 - lr x weight_decay (usual: weight_decay = 0.1)")
        if 0 < self.temperature < 1e-3:
            raise ConfigError(f"temperature {self.temperature} is too small to divide by; use 0 for greedy samples")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        for f in ("beta1", "beta2"):
            if not 0 <= getattr(self, f) < 1:
                raise ConfigError(f"{f} must be in [0, 1), got {getattr(self, f)}")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"dtype must be auto, float32 or bfloat16; got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be {' or '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be {' or '.join(SCHEDULES)}, got {self.schedule!r} (cosine: half a "
                              f"cosine down to min_lr; wsd: a flat rate, then a straight line down)")
        if not 0 < self.decay <= 1:
            raise ConfigError(f"decay must be in (0, 1], the fraction of the steps spent going down; got {self.decay}")
        if self.muon_lr <= 0:
            raise ConfigError(f"muon_lr must be positive, got {self.muon_lr}")
        if not 1 <= self.muon_ns_steps < 100:
            raise ConfigError(f"muon_ns_steps must be from 1 to 99 (Newton-Schulz iterations a step; usual: 5), "
                              f"got {self.muon_ns_steps}")
        if self.optimizer == "muon" and self.parallel == "fsdp":
            raise ConfigError("optimizer = \"muon\" orthogonalises whole matrices, which parallel = \"fsdp\" splits "
                              "between processes; use parallel = \"ddp\" or optimizer = \"adamw\"")
        if self.parallel not in PARALLEL:
            raise ConfigError(f"parallel must be {' or '.join(PARALLEL)}, got {self.parallel!r} (ddp: every process "
                              f"holds the whole model; fsdp: each holds a shard of it)")
        corpus = [self.corpus] if isinstance(self.corpus, str) else self.corpus
        if not corpus or any(not c.strip() for c in corpus):
            raise ConfigError(f"corpus {self.corpus!r} names nothing: give \"shakespeare\" or text files, "
                              f"directories or globs")
        for f in ("tokenizer", "out_dir", "device"):
            if not getattr(self, f).strip():
                raise ConfigError(f"{f} must not be empty (default: {getattr(TrainConfig, f)!r})")
        if self.tokenizer == "bpe" and self.vocab_size < 257:
            raise ConfigError(f"vocab_size must be >= 257 for tokenizer = \"bpe\" (256 bytes + end-of-text), "
                              f"got {self.vocab_size}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.sample_tokens > MAX_SAMPLE_TOKENS:
            raise ConfigError(f"sample_tokens {self.sample_tokens:,} is more than a sample holds (at most "
                              f"{MAX_SAMPLE_TOKENS:,}: it is printed at every evaluation); use lumen generate for more")
        check_threads(self.threads, "threads", ConfigError)
        resolve_device(self.device)  # a device this machine has, now rather than after the data is prepared

    @property
    def windows_per_step(self) -> int:
        """Context windows per optimizer step, over all processes (the global batch)."""
        return self.batch_size * self.grad_accum

    def prepare_data(self, quiet: bool = True) -> TokenData:
        """This run's corpus, tokenized once (cached) and memory-mapped."""
        return prepare(self.corpus, self.tokenizer, self.vocab_size, self.validation or None, self.val_fraction,
                       quiet=quiet)

    def sample_prompt_ids(self, tokenizer: Tokenizer) -> list[int]:
        """The sample prompt's token ids, checked before the first step (an empty prompt: end-of-text, or 0)."""
        if not self.sample_tokens:
            return []
        try:
            ids = tokenizer.encode(self.sample_prompt)
        except LumenError as e:
            raise ConfigError(f"sample_prompt {self.sample_prompt!r} cannot be encoded by the {tokenizer.kind} "
                              f"tokenizer of this corpus ({e}); set sample_prompt to text from the corpus, "
                              f"or sample_tokens = 0") from None
        return ids or [tokenizer.eos_id or 0]

    def replace(self, **changes: typing.Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_memory(cfg: TrainConfig, model_cfg: ModelConfig, device: torch.device) -> None:
    """Refuse, before anything is built, a run that cannot fit in the device's memory: a lower bound on what it
    needs (the weights, their gradients and AdamW's two moments, 16 bytes per parameter in float32; the logits
    of one micro-batch and their gradient; the stream each block keeps for the backward pass; the window
    offsets of one step) against the device's total memory. A bound from below never refuses a run that fits;
    it catches a batch_size or d_model off by orders of magnitude, which would fail deep inside torch."""
    tokens = cfg.batch_size * model_cfg.context  # one micro-batch
    # per token: the logits and their gradient in float32 (the loss reads a float32 copy), and what each block
    # keeps for the backward pass, at bfloat16's 2 bytes (its input and attention output, the MLP's hidden units)
    per_token = 8 * model_cfg.vocab_size + 2 * model_cfg.n_layers * (4 * model_cfg.d_model + 2 * model_cfg.hidden)
    need = 16 * count(model_cfg).total + tokens * per_token + 8 * cfg.windows_per_step
    have = device_memory(device)
    if have and need > have:
        raise ConfigError(
            f"this run needs at least {need / 2**30:,.1f} GiB (batch_size {cfg.batch_size:,} x grad_accum "
            f"{cfg.grad_accum:,} windows of {model_cfg.context:,} tokens, a model of d_model {model_cfg.d_model:,} "
            f"x {model_cfg.n_layers:,} blocks) but the {device.type} device has {have / 2**30:,.1f} GiB: "
            "lower batch_size (raise grad_accum for the same batch), model.context or the model's size")


def device_memory(device: torch.device) -> int:
    """The total memory of a device in bytes (0 if unknown): a GPU's own, else the machine's."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # (no sysconf on this system)
        return 0


def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _accepts(tp: object, value: object) -> bool:
    """Whether value fits the annotation tp (int where float is wanted is fine; bool is not an int)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(t, value) for t in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp)
        return isinstance(value, list) and all(_accepts(inner, v) for v in value)
    if origin is tuple:  # tuple[X, ...]: TOML holds it as a list
        inner = typing.get_args(tp)[0]
        return isinstance(value, (list, tuple)) and all(_accepts(inner, v) for v in value)
    if dataclasses.is_dataclass(tp):  # a table of the dataclass's fields (RopeScaling): the dataclass checks them
        return isinstance(value, dict) or (isinstance(tp, type) and isinstance(value, tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)  # type: ignore[arg-type]


def _type_name(tp: object) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


def check_types(obj: object) -> None:
    for name, tp in _hints(type(obj)).items():
        value = getattr(obj, name)
        if not _accepts(tp, value):
            raise ConfigError(f"{name} must be {_type_name(tp)}, got {value!r} ({type(value).__name__})")
        if type(value) is int and int not in (typing.get_args(tp) or (tp,)):
            setattr(obj, name, float(value))  # a whole number given for a float (torch's AdamW takes no int beta)


def _model_hints() -> dict[str, object]:
    return _hints(ModelConfig)


# The built-in runs. "shakespeare" is the README's first command, sized by time: about five minutes of training on
# the machine that runs it (train.budget; `steps` is the count where the budget is set to 0). A byte-level BPE
# (each token spells several characters, so the model sees more text in the same minutes), a compiled step (at
# this small shape an eager step is mostly per-operation overhead), Muon and a warm-up-stable-decay schedule.
# What it reaches, how fast, and the record table of the changes that got it there: docs/speed.md (bench/speedrun.py).
PRESETS: dict[str, dict] = {
    "shakespeare": {
        "corpus": "shakespeare", "tokenizer": "bpe", "vocab_size": 4096, "out_dir": "runs/shakespeare",
        "steps": 2200, "time_budget": 300, "compile": True, "batch_size": 16, "optimizer": "muon", "muon_lr": 0.02,
        "lr": 3e-3, "schedule": "wsd", "decay": 0.4, "min_lr": 3e-5, "warmup": 50, "beta2": 0.99,
        "weight_decay": 0.1, "eval_interval": 550, "eval_windows": 200, "sample_tokens": 200,
        "model": {"preset": "baby-gpt", "n_layers": 4, "d_model": 128, "n_heads": 4, "context": 128},
    },
    # more time or a GPU: nanoGPT's shakespeare-char shape, longer
    "shakespeare-long": {
        "corpus": "shakespeare", "tokenizer": "char", "out_dir": "runs/shakespeare-long",
        "steps": 5000, "batch_size": 64, "lr": 1e-3, "min_lr": 1e-4, "warmup": 200, "beta2": 0.99,
        "eval_interval": 500, "eval_windows": 400, "keep_last": 3,
        "model": {"preset": "baby-gpt", "n_layers": 6, "d_model": 384, "n_heads": 6, "context": 256, "dropout": 0.2},
    },
    # a few seconds: tests and smoke checks
    "tiny": {
        "corpus": "shakespeare", "tokenizer": "char", "out_dir": "runs/tiny",
        "steps": 20, "batch_size": 4, "lr": 3e-3, "warmup": 2, "eval_interval": 10, "eval_windows": 8,
        "sample_tokens": 40, "log_interval": 1, "threads": 1,
        "model": {"preset": "baby-gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "context": 32},
    },
}


def parse_value(text: str) -> object:
    """A --set value as TOML would read it (numbers, booleans, lists, quoted strings), else the raw text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_set(raw: dict, assignment: str) -> None:
    """Apply one `key=value` (or `model.key=value`) to a raw config dict."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects key=value, got {assignment!r}")
    key, value = assignment.split("=", 1)
    key = key.strip()
    target = raw
    if key.startswith("model."):
        target = raw.setdefault("model", {})
        key = key[len("model."):]
    target[key] = parse_value(value.strip())


def from_dict(raw: dict, where: str = "config") -> tuple[TrainConfig, ModelConfig]:
    """Validate a raw (TOML-shaped) dict into the run's and the model's config, with errors that list
    what is valid."""
    raw = dict(raw)
    model_raw = raw.pop("model", {})
    if not isinstance(model_raw, dict):
        raise ConfigError(f"{where}: model must be a [model] table of ModelConfig fields, got {model_raw!r}")
    model_raw = dict(model_raw)
    valid = [f.name for f in dataclasses.fields(TrainConfig)]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {', '.join(valid)}, and a [model] table")
    cfg = TrainConfig(**raw)
    preset = model_raw.pop("preset", "baby-gpt")
    if not isinstance(preset, str):
        raise ConfigError(f"{where}: model.preset must be a preset name (a string), got {preset!r}")
    model_valid = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = sorted(set(model_raw) - set(model_valid))
    if unknown:
        raise ConfigError(f"{where}: unknown [model] key(s) {unknown}; valid: preset, {', '.join(model_valid)}")
    hints = _model_hints()
    for k, v in model_raw.items():
        if not _accepts(hints[k], v):
            raise ConfigError(f"{where}: model.{k} must be {_type_name(hints[k])}, got {v!r}")
    for k, v in model_raw.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{where}: model.{k} must be a finite number, got {v}")
    try:
        model_cfg = ModelConfig.from_name(preset).replace(**model_raw)
    except LumenError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (ValueError, TypeError) as e:  # a value ModelConfig's own checks do not name
        raise ConfigError(f"{where}: [model] {e}") from None
    return cfg, model_cfg


def load_config(
    path: str | Path | None = None, preset: str | None = None, sets: list[str] | None = None
) -> tuple[TrainConfig, ModelConfig]:
    """The config of a preset, or of a TOML file (on top of the defaults), then `key=value` overrides."""
    if path is not None and preset is not None:
        raise ConfigError("give a preset or a config file, not both")
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown training preset {preset!r}; choose one of: {', '.join(PRESETS)}")
        raw, where = _deep_copy(PRESETS[preset]), f"preset {preset}"
    elif path is not None:
        p = Path(path)
        if not p.is_file():
            raise MissingFileError(f"no config file {p} (give a TOML file or --preset {'|'.join(PRESETS)})")
        raw = read_toml(p, "training config")
        where = str(p)
    else:
        raw, where = {}, "config"
    for s in sets or []:
        apply_set(raw, s)
    named = {s.partition("=")[0].strip() for s in sets or []}
    if "steps" in named and "time_budget" not in named:
        raw["time_budget"] = 0  # steps given: the count asked for, not one chosen by time
    try:
        return from_dict(raw, where)
    except ConfigError as e:
        raise e if str(e).startswith(where) else ConfigError(f"{where}: {e}") from None
    except TypeError as e:  # a missing/odd field the dataclass itself rejects
        raise ConfigError(f"{where}: {e}") from None


def _deep_copy(d: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else (list(v) if isinstance(v, list) else v) for k, v in d.items()}


def to_toml(cfg: TrainConfig, model_cfg: ModelConfig) -> str:
    """The full config as TOML text (what a run saves as config.toml, and what `--print-config` shows)."""
    lines = ["# lumen train config"]
    for k, v in cfg.to_dict().items():
        lines.append(f"{k} = {_toml_value(v)}")
    lines.append("")
    lines.append("[model]  # vocab_size is the tokenizer's")
    for k, v in model_cfg.to_dict().items():
        if v is not None and k != "vocab_size":
            lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table (RoPE scaling)
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)  # a basic TOML string: JSON escapes are TOML escapes
