"""lumen's own checkpoints: a directory that is a complete model spec, written atomically.

    step-000500/
      model.safetensors   weights, in lumen's parameter names; a tied unembedding is stored once
      config.json         the ModelConfig
      tokenizer.json      the tokenizer the model was trained with
      meta.json           step, validation loss, ...
      trainer.pt          optimizer, schedule, RNG and data-position state (only in training runs)
      manifest.json       every other file's size and sha256, written last: `verify` checks it is intact

A run directory holds such checkpoints under `checkpoints/` and names its best one in `best.json`:

    >>> model, tok = load_run("runs/shakespeare")       # doctest: +SKIP

A checkpoint is first written into a hidden temporary directory beside its final place, every file
fsync'ed, then renamed into place in one step: a crash or a full disk never leaves half a checkpoint
under a real name, and the previous checkpoints are never touched.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..errors import CheckpointError, LumenError, MissingFileError
from ..fetch import sha256_of
from ..files import atomic_dir, read_json, recover_dir
from ..model import GPT
from ..tokenizers import FILENAME as TOKENIZER_FILE
from ..tokenizers import Tokenizer
from .weights import check_one_unembedding, read_safetensors

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
META = "meta.json"
TRAINER = "trainer.pt"
MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
BEST = "best.json"
PREFIX = "step-"


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside torch.compile's and DistributedDataParallel's wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile
            inner = model._orig_mod
            assert isinstance(inner, nn.Module)
            model = inner
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights to store: lumen's names (no wrapper prefixes), each shared tensor once, contiguous."""
    state, seen = {}, set()
    for name, t in unwrap(model).state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:  # the tied unembedding is the embedding: keep the first name only
            continue
        seen.add(key)
        state[name] = t.detach().contiguous().cpu()
    return state


def is_checkpoint(path: Path) -> bool:
    return (path / WEIGHTS).is_file() and (path / CONFIG).is_file()


def step_of(path: Path) -> int | None:
    """The step a checkpoint folder's name gives (step-000500: 500); None for any other name."""
    m = re.fullmatch(re.escape(PREFIX) + r"(\d+)", path.name)
    return int(m.group(1)) if m else None


def step_key(path: Path) -> int:
    """The step of a path already known to be a step-N folder: a sort key for `step_of`'s survivors."""
    step = step_of(path)
    assert step is not None, path
    return step


def checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run (step-N folders with weights and config), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and is_checkpoint(p)]
    return sorted(found, key=step_key)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (None if it has none)."""
    found = checkpoints(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint `best.json` names, if it still exists (None when best.json is missing or unreadable)."""
    pointer = Path(run_dir) / BEST
    try:
        name = read_json(pointer, "best checkpoint", CheckpointError)["checkpoint"]
        path = Path(run_dir) / CHECKPOINTS / name
    except (LumenError, KeyError, TypeError, ValueError):
        return None
    return path if path.parent.name == CHECKPOINTS and is_checkpoint(path) else None


def resolve(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint or run directory (a run's best, else its latest)."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"no such run or checkpoint: {path}")
    if is_checkpoint(path):
        return path
    found = best_checkpoint(path) or latest_checkpoint(path)
    if found is None:
        raise MissingFileError(
            f"{path} is neither a lumen checkpoint ({WEIGHTS} + {CONFIG}) nor a run directory with "
            f"{CHECKPOINTS}/{PREFIX}N inside (train one with `lumen train`)"
        )
    return found


def load_run(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, Tokenizer | None]:
    """The model (in eval mode) and tokenizer of a run directory or one checkpoint directory."""
    ckpt = resolve(path)
    cfg = ModelConfig.load(ckpt / CONFIG)
    state = read_safetensors(ckpt / WEIGHTS)
    check_one_unembedding(cfg, state, str(ckpt / WEIGHTS))
    model = GPT.from_state(cfg, state, source=str(ckpt / WEIGHTS)).to(device)
    tok_path = ckpt / TOKENIZER_FILE
    tok = Tokenizer.load(tok_path) if tok_path.is_file() else None
    if tok is not None:
        tok.check_fits(cfg.vocab_size, str(tok_path))
    return model, tok


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    tokenizer: Tokenizer | None = None,
    meta: dict | None = None,
    trainer_state: dict | None = None,
) -> Path:
    """Write a checkpoint directory at path, atomically; an existing one there is replaced."""
    from safetensors.torch import save_file

    raw = unwrap(model)
    assert isinstance(raw, GPT)
    with atomic_dir(path) as tmp:
        save_file(model_state(raw), str(tmp / WEIGHTS), metadata={"format": "pt"})
        raw.cfg.save(tmp / CONFIG)
        if tokenizer is not None:
            tokenizer.save(tmp)
        if trainer_state is not None:
            torch.save(trainer_state, tmp / TRAINER)
        (tmp / META).write_text(json.dumps(meta or {}, indent=1) + "\n")
        write_manifest(tmp)
    return Path(path)


def write_manifest(ckpt: Path) -> None:
    """manifest.json: the size and sha256 of every file in the checkpoint (written last)."""
    files = {f.name: {"bytes": f.stat().st_size, "sha256": sha256_of(f)}
             for f in sorted(ckpt.iterdir()) if f.is_file() and f.name != MANIFEST}
    (ckpt / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n")


def verify(ckpt: str | Path) -> None:
    """Check a checkpoint against its manifest (every file there, with its size and sha256); raise
    CheckpointError saying what is wrong."""
    ckpt = Path(ckpt)
    if not (ckpt / MANIFEST).is_file():
        raise CheckpointError(f"{ckpt} has no {MANIFEST}: it was not completely written")
    manifest = read_json(ckpt / MANIFEST, "checkpoint manifest", CheckpointError, "the checkpoint is damaged")
    listed = manifest.get("files") or {}  # (a manifest listing nothing fails below)
    try:
        entries = [(str(name), int(e["bytes"]), str(e["sha256"])) for name, e in listed.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{ckpt / MANIFEST} is damaged (not the manifest lumen writes)") from None
    for name, size, digest in entries:
        f = ckpt / name
        if "/" in name or not f.is_file():
            raise CheckpointError(f"{ckpt}: {name} is missing")
        if f.stat().st_size != size:
            raise CheckpointError(f"{f} has {f.stat().st_size:,} bytes, the manifest says {size:,}")
        if sha256_of(f) != digest:
            raise CheckpointError(f"{f} is damaged (its sha256 differs from the manifest's)")
    if not {WEIGHTS, CONFIG} <= {name for name, _, _ in entries}:
        raise CheckpointError(f"{ckpt / MANIFEST} does not list {WEIGHTS} and {CONFIG}")


def intact(ckpt: str | Path) -> bool:
    """Whether a checkpoint matches its manifest."""
    try:
        verify(ckpt)
    except CheckpointError:
        return False
    return True


def clean_partial(run_dir: str | Path) -> None:
    """After a crash: drop half-written checkpoints; put back one that was being replaced."""
    recover_dir(Path(run_dir) / CHECKPOINTS, is_checkpoint)


def load_trainer_state(ckpt: str | Path) -> dict:
    """The optimizer/schedule/RNG/data state of a training checkpoint (tensors and plain values only)."""
    path = Path(ckpt) / TRAINER
    if not path.is_file():
        raise MissingFileError(f"{ckpt} has no {TRAINER}: it holds weights only and cannot be resumed")
    try:  # tensors and plain values only: never unpickles code
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged file fails anywhere in torch's reader (seen: Unpickling-,
        # Runtime-, EOF-, Index-, Key-, UnicodeDecode-, OSError): each means the same, this file is damaged
        raise CheckpointError(f"{path} is damaged ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}); "
                              f"resume from an earlier checkpoint") from None
    if not _looks_like_trainer_state(state):
        raise CheckpointError(f"{path} is not the trainer state lumen writes; resume from an earlier checkpoint")
    return state


_TRAINER_KEYS = {"optimizer": dict, "step": int, "tokens": int, "best": float, "data_generator": torch.Tensor,
                 "torch_rng": list, "world": int, "train_config": str}


def _looks_like_trainer_state(state: object) -> bool:
    return isinstance(state, dict) and all(isinstance(state.get(k), t) for k, t in _TRAINER_KEYS.items())
