"""lumen's own checkpoints: a directory that is a complete model spec, written atomically.

    step-000500/
      model.safetensors   weights, in lumen's parameter names; a tied unembedding is stored once
      config.json         the ModelConfig
      tokenizer.json      the tokenizer the model was trained with
      meta.json           step, validation loss, ...
      trainer.pt          optimizer, schedule, RNG and data-position state (only in training runs)
      manifest.json       every other file's size and sha256, written last: `verify` checks it is intact

A sharded run (parallel = "fsdp") writes `shards/` in place of model.safetensors: torch.distributed.checkpoint's
folder (.metadata, and a __R_0.distcp file written by each rank R) holding the weights and AdamW's moments,
each tensor in the pieces the ranks held. It resumes at any number of processes (`load_sharded`), and it
loads wherever a run loads: `read_sharded_state` puts the pieces together into whole tensors, after `verify`
has checked every file against the manifest. Its files carry one checkpoint id (meta.json, trainer.pt, the
index, and a small tensor in each rank's shard file), so that files of two checkpoints put together, even
under a manifest rewritten to match them, are told apart from one checkpoint.

A run directory holds such checkpoints under `checkpoints/` and names its best one in `best.json`:

    >>> weights = read_run("runs/shakespeare")           # doctest: +SKIP
    >>> loaded = lumen.formats.load("runs/shakespeare")  # the same, built: a GPT and its tokenizer  # doctest: +SKIP

A checkpoint is first written into a hidden temporary directory beside its final place, every file
fsync'ed, then renamed into place in one step: a crash or a full disk never leaves half a checkpoint
under a real name, and the previous checkpoints are never touched.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import re
import stat
import uuid
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.futures import Future

from ..config import ModelConfig
from ..errors import CheckpointError, LumenError, MissingFileError
from ..fetch import sha256_of
from ..files import atomic_dir, read_json, recover_dir
from ..model import GPT
from ..tokenizers import FILENAME as TOKENIZER_FILE
from ..tokenizers import Tokenizer
from .weights import Weights, read_safetensors

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
META = "meta.json"
TRAINER = "trainer.pt"
MANIFEST = "manifest.json"
SHARDS = "shards"  # a sharded checkpoint's torch.distributed.checkpoint folder
SHARD_INDEX = f"{SHARDS}/.metadata"
CHECKPOINTS = "checkpoints"
BEST = "best.json"
PREFIX = "step-"
ID = "checkpoint_id"  # a sharded checkpoint's id: in meta.json, trainer.pt, the index and each rank's shard file


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
    return ((path / WEIGHTS).is_file() or is_sharded(path)) and (path / CONFIG).is_file()


def is_sharded(path: Path) -> bool:
    """Whether a checkpoint holds its weights as the shards of a sharded run (no model.safetensors)."""
    return (path / SHARD_INDEX).is_file() and not (path / WEIGHTS).is_file()


def step_of(path: Path) -> int | None:
    """The step a checkpoint folder's name gives (step-000500: 500); None for any other name."""
    m = re.fullmatch(re.escape(PREFIX) + r"(\d+)", path.name)
    return int(m.group(1)) if m else None


def step_key(path: Path) -> int:
    """The step of a path already known to be a step-N folder: a sort key for `step_of`'s survivors."""
    step = step_of(path)
    assert step is not None, path
    return step


def file_kind(path: Path) -> str | None:
    """None for a regular file (a link to one too); else what is there instead ("missing", "a FIFO", ...),
    found without opening it: a FIFO opened for reading waits for a writer forever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or type(e).__name__})"
    if stat.S_ISREG(mode):
        return None
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device")


def incomplete(path: Path) -> str | None:
    """What keeps a folder from being a complete checkpoint (its config, and its weights, whole or sharded);
    None when it is one."""
    if kind := file_kind(path / CONFIG):
        return f"{CONFIG} is {kind}"
    weights, index = file_kind(path / WEIGHTS), file_kind(path / SHARD_INDEX)
    if weights is None or index is None:
        return None
    if weights != "missing":
        return f"{WEIGHTS} is {weights}"
    if index != "missing" or (path / SHARDS).is_dir():
        return f"{SHARD_INDEX} is {index}"
    return f"it has neither {WEIGHTS} nor {SHARD_INDEX}"


def checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run (step-N folders with weights and config), oldest first."""
    return [p for p in step_folders(run_dir) if is_checkpoint(p)]


def step_folders(run_dir: str | Path) -> list[Path]:
    """Every step-N folder of a run, complete or not, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if step_of(p) is not None and p.is_dir()), key=step_key)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (None if it has none)."""
    found = checkpoints(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint `best.json` names, if it still exists (None when best.json is missing or unreadable)."""
    path, _ = _named_best(Path(run_dir))
    return path if path is not None and is_checkpoint(path) else None


def _named_best(run: Path) -> tuple[Path | None, str]:
    """The step folder best.json names (None if it names none), and else why not, in words for a note."""
    pointer = run / BEST
    kind = file_kind(pointer)
    if kind == "missing":
        return None, "the run names no best one"
    if kind:
        return None, f"{BEST} is {kind}, not a file, so the best is unknown"
    try:
        name = read_json(pointer, "best checkpoint", CheckpointError)["checkpoint"]
        path = run / CHECKPOINTS / name
    except (LumenError, KeyError, TypeError, ValueError):
        return None, f"{BEST} is damaged, so the best is unknown"
    if path.parent != run / CHECKPOINTS or step_of(path) is None:
        return None, f"{BEST} is damaged (it names {str(name)[:40]!r}), so the best is unknown"
    if not path.is_dir():
        return None, f"{BEST} names {path.name}, which is gone"
    return path, ""


def choose(run_dir: str | Path) -> tuple[Path, str]:
    """The checkpoint a run directory is read at, and why (for a note): the one best.json names, the best by
    validation loss; else the newest. The one chosen must be complete: a damaged one is an error that says
    what is wrong, never a quiet step back to an older checkpoint.

        >>> path, why = choose("runs/shakespeare")   # doctest: +SKIP
        >>> why                                       # doctest: +SKIP
        'the best checkpoint by validation loss, and the latest'
    """
    run = Path(run_dir)
    found = step_folders(run)
    if not found:
        raise MissingFileError(f"{run} has no {CHECKPOINTS}/{PREFIX}N folder: it is not a run with a checkpoint "
                               f"yet (train one with `lumen train`)")
    newest = found[-1]
    best, why_not = _named_best(run)
    if best is None:
        chosen, why = newest, f"the latest checkpoint; {why_not}"
    elif best == newest:
        chosen, why = best, "the best checkpoint by validation loss, and the latest"
    else:
        chosen, why = best, f"the best checkpoint by validation loss; the latest is {newest}: give it to read that"
    problem = incomplete(chosen)
    if problem:
        others = [p for p in reversed(found) if p != chosen and is_checkpoint(p)]
        alternative = f"; give another checkpoint folder to read, e.g. {others[0]}" if others else ""
        raise CheckpointError(f"{run} is read at {chosen.name} ({why.split(';')[0]}), which is damaged "
                              f"({problem}){alternative}")
    return chosen, why


def resolve(path: str | Path) -> Path:
    """A checkpoint directory from a checkpoint or run directory (a run's best, else its latest: `choose`)."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"no such run or checkpoint: {path}")
    if is_checkpoint(path):
        return path
    if step_folders(path):
        return choose(path)[0]
    if step_of(path) is not None or any((path / name).exists() for name in (MANIFEST, CONFIG, SHARDS)):
        raise CheckpointError(f"{path} is not a complete checkpoint ({incomplete(path)}); it is damaged")
    raise MissingFileError(
        f"{path} is neither a lumen checkpoint ({WEIGHTS} + {CONFIG}) nor a run directory with "
        f"{CHECKPOINTS}/{PREFIX}N inside (train one with `lumen train`)"
    )


def read_run(path: str | Path) -> Weights:
    """The weights, config and tokenizer of a run directory (its best checkpoint, else its latest) or of one
    checkpoint directory (a sharded one checked against its manifest first)."""
    ckpt = resolve(path)
    cfg = ModelConfig.load(ckpt / CONFIG)
    tok_path = ckpt / TOKENIZER_FILE
    kind = file_kind(tok_path)
    if kind not in (None, "missing"):
        raise CheckpointError(f"{tok_path} is {kind}, not a file; the checkpoint is damaged")
    tok = Tokenizer.load(tok_path) if kind is None else None
    if tok is not None:
        tok.check_fits(cfg.vocab_size, str(tok_path))
    weights = ckpt / (SHARDS if is_sharded(ckpt) else WEIGHTS)
    state = read_sharded_state(ckpt) if is_sharded(ckpt) else read_safetensors(weights)
    return Weights(cfg, state, str(weights), tok)


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


def write_manifest(ckpt: Path, hashed: dict[str, dict] | None = None) -> None:
    """manifest.json: the size and sha256 of every file in the checkpoint, shards included (written last).
    hashed: entries already computed (by the ranks that share a sharded checkpoint's hashing)."""
    hashed = hashed or {}
    files = {}
    for f in sorted(ckpt.rglob("*")):
        name = f.relative_to(ckpt).as_posix()
        if f.is_file() and name != MANIFEST:
            files[name] = hashed.get(name) or {"bytes": f.stat().st_size, "sha256": sha256_of(f)}
    (ckpt / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n")


def verify(ckpt: str | Path, needs: tuple[str, ...] = ()) -> None:
    """Check a checkpoint against its manifest (every file there, with its size and sha256; none opened that
    is not a regular file); a sharded one's index names only files the manifest lists, and its files carry
    one checkpoint id. needs: the files it must hold (default: a model's config and weights, or its shards;
    a sparse dictionary's checkpoint names its own). Raise CheckpointError saying what is wrong."""
    ckpt = Path(ckpt)
    kind = file_kind(ckpt / MANIFEST)
    if kind == "missing":
        raise CheckpointError(f"{ckpt} has no {MANIFEST}: it was not completely written")
    if kind:
        raise CheckpointError(f"{ckpt / MANIFEST} is {kind}, not a file: the checkpoint is damaged")
    manifest = read_json(ckpt / MANIFEST, "checkpoint manifest", CheckpointError, "the checkpoint is damaged")
    listed = manifest.get("files") or {}  # (a manifest listing nothing fails below)
    try:
        entries = [(str(name), int(e["bytes"]), str(e["sha256"])) for name, e in listed.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{ckpt / MANIFEST} is damaged (not the manifest lumen writes)") from None
    for name, size, digest in entries:
        f = ckpt / name
        kind = file_kind(f) if _listable(name) else "missing"
        if kind == "missing":
            raise CheckpointError(f"{ckpt}: {name} is missing")
        if kind:
            raise CheckpointError(f"{f} is {kind}, not a file: the checkpoint is damaged")
        if f.stat().st_size != size:
            raise CheckpointError(f"{f} has {f.stat().st_size:,} bytes, the manifest says {size:,}")
        if sha256_of(f) != digest:
            raise CheckpointError(f"{f} is damaged (its sha256 differs from the manifest's)")
    names = {name for name, _, _ in entries}
    if needs:
        if missing := [n for n in needs if n not in names]:
            raise CheckpointError(f"{ckpt / MANIFEST} does not list {', '.join(missing)}")
        return
    if CONFIG not in names or not ({WEIGHTS, SHARD_INDEX} & names):
        raise CheckpointError(f"{ckpt / MANIFEST} does not list {CONFIG} and {WEIGHTS} (or {SHARD_INDEX})")
    if is_sharded(ckpt):
        _check_shards(ckpt, names)


def _check_shards(ckpt: Path, listed: set[str]) -> None:
    """A sharded checkpoint's index names only shard files the manifest lists, and every file carries the
    id of meta.json: files of two checkpoints put together (under a manifest rewritten to match) are refused."""
    folder = ckpt / SHARDS
    md = _ShardReader(folder).read_metadata()
    files = {info.relative_path for info in md.storage_data.values()}
    unlisted = sorted(f for f in files if f"{SHARDS}/{f}" not in listed)
    if unlisted:
        raise CheckpointError(f"{ckpt / SHARD_INDEX} names {unlisted[0]}, which {MANIFEST} does not list: the "
                              f"index belongs to another checkpoint")
    meta = read_json(ckpt / META, "checkpoint meta", CheckpointError, "the checkpoint is damaged") \
        if f"{META}" in listed else {}
    want = meta.get(ID)
    marks = {k: v for k, v in md.state_dict_metadata.items() if k.startswith(f"{ID}.")}
    if want is None and not marks:
        return  # written before checkpoints carried an id
    if not isinstance(want, str) or not re.fullmatch(r"[0-9a-f]{32}", want):
        raise CheckpointError(f"{ckpt / META} has no {ID} although the shards carry one: the checkpoint is damaged "
                              f"or put together from two")
    another = "belongs to another checkpoint than meta.json (their checkpoint ids differ): the checkpoint was put " \
              "together from two; use another checkpoint"
    if (md.storage_meta.save_id if md.storage_meta else None) != want:
        raise CheckpointError(f"{ckpt / SHARD_INDEX} {another}")
    unmarked = sorted(files - {info.relative_path for idx, info in md.storage_data.items() if idx.fqn in marks})
    if unmarked:
        raise CheckpointError(f"{folder / unmarked[0]} carries no {ID}: it {another}")
    if not all(isinstance(m, dcp_metadata.TensorStorageMetadata) and tuple(m.size) == (16,)
               and m.properties.dtype == torch.uint8 for m in marks.values()):
        raise CheckpointError(f"{ckpt / SHARD_INDEX}: its {ID} entries are not what lumen writes; the index is "
                              f"damaged")
    read = {k.split(".", 1)[1]: torch.zeros(16, dtype=torch.uint8) for k in marks}
    try:
        with _alone_is_fine():
            dcp.load({ID: read}, storage_reader=_ShardReader(folder), no_dist=True)
    except CheckpointException as e:
        raise CheckpointError(f"{folder} cannot be read ({_reason(e)}): it is damaged; use another "
                              f"checkpoint") from None
    for rank, mark in sorted(read.items()):
        if bytes(mark.tolist()).hex() != want:
            holder = next(info.relative_path for idx, info in md.storage_data.items() if idx.fqn == f"{ID}.{rank}")
            raise CheckpointError(f"{folder / holder} {another}")
    if f"{TRAINER}" in listed and load_trainer_state(ckpt).get(ID) != want:
        raise CheckpointError(f"{ckpt / TRAINER} {another}")


def _listable(name: str) -> bool:
    """A name a manifest may list: a file of the checkpoint, or one directly inside its shards/ folder."""
    parts = name.split("/")
    return (len(parts) == 1 or (len(parts) == 2 and parts[0] == SHARDS)) and all(p not in ("", ".", "..")
                                                                               for p in parts)


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
        raise CheckpointError(f"{path} is damaged ({_reason(e)}); resume from an earlier checkpoint") from None
    if not _looks_like_trainer_state(state):
        raise CheckpointError(f"{path} is not the trainer state lumen writes; resume from an earlier checkpoint")
    return state


_TRAINER_KEYS = {"optimizer": dict, "step": int, "tokens": int, "best": float, "data_generator": torch.Tensor,
                 "torch_rng": list, "world": int, "train_config": str}


def _looks_like_trainer_state(state: object) -> bool:
    return isinstance(state, dict) and all(isinstance(state.get(k), t) for k, t in _TRAINER_KEYS.items())


# sharded checkpoints (parallel = "fsdp") -----------------------------------------------------------------
def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The weights and the optimizer's state by parameter name, as this process holds them (a sharded
    model's are its shards, DTensors): torch.distributed.checkpoint.state_dict's view, which is the same
    for one process and for N. A tied unembedding is the embedding: kept once, under tok_emb.weight."""
    weights, optim = get_state_dict(model, optimizer)
    raw = unwrap(model)
    if isinstance(raw, GPT) and raw.cfg.tie_embeddings:
        weights.pop("lm_head.weight", None)
    return weights, optim


def save_sharded_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                            tokenizer: Tokenizer | None = None, meta: dict | None = None,
                            trainer_state: dict | None = None) -> Path:
    """Write a sharded checkpoint at path; every rank of the run calls it (one process alone writes every
    shard). Each rank writes its own pieces of the weights and of AdamW's moments into `shards/` of rank 0's
    temporary folder, and hashes a share of the shard files; rank 0 writes the config, tokenizer, trainer
    state (with the optimizer's hyperparameters: the shards hold tensors only) and meta.json, then the
    manifest, last, and renames the folder into place: a checkpoint appears whole or not at all.
    Several machines need one shared filesystem at the same path (torch.distributed.checkpoint's own rule)."""
    raw = unwrap(model)
    assert isinstance(raw, GPT)
    main = not dist.is_initialized() or dist.get_rank() == 0
    rank = dist.get_rank() if dist.is_initialized() else 0
    with atomic_dir(path) if main else contextlib.nullcontext() as tmp:
        folder = Path(_from_rank0(str(tmp) if main else None)) / SHARDS
        checkpoint_id = _from_rank0(uuid.uuid4().hex if main else None)
        weights, optim = sharded_state(raw, optimizer)
        mark = torch.tensor(list(bytes.fromhex(checkpoint_id)), dtype=torch.uint8)  # in this rank's own file
        try:
            with _alone_is_fine():
                dcp.save({"model": weights, "optimizer": optim["state"], ID: {str(rank): mark}},
                         storage_writer=_ShardWriter(folder, checkpoint_id))
        except CheckpointException as e:  # a rank's failure, told to every rank: a full disk is an OSError
            raise next((f for f in failures(e) if isinstance(f, OSError)), e) from e
        hashed = _hash_share(folder)
        if main:
            assert tmp is not None
            raw.cfg.save(tmp / CONFIG)
            if tokenizer is not None:
                tokenizer.save(tmp)
            if trainer_state is not None:
                torch.save({**trainer_state, "optimizer": {"param_groups": optim["param_groups"]},
                            ID: checkpoint_id}, tmp / TRAINER)
            (tmp / META).write_text(json.dumps({**(meta or {}), ID: checkpoint_id}, indent=1) + "\n")
            write_manifest(tmp, hashed)
    return Path(path)


def _from_rank0(value: str | None) -> str:
    """Rank 0's value, on every rank."""
    if not dist.is_initialized():
        assert value is not None
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


def _hash_share(folder: Path) -> dict[str, dict]:
    """The manifest entries of the shard files, each rank hashing every N-th one (all of them, gathered)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = {f"{SHARDS}/{f.name}": {"bytes": f.stat().st_size, "sha256": sha256_of(f)}
            for f in sorted(folder.iterdir())[rank::world] if f.is_file()}
    if world == 1:
        return mine
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    return {k: v for share in every for k, v in share.items()}


def load_sharded(ckpt: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 param_groups: list[dict]) -> None:
    """Put a sharded checkpoint's weights and AdamW state into a model being trained and its optimizer, at
    any number of processes (every rank calls it; each reads the pieces of the shards that its own shards
    now cover, so a checkpoint of 2 processes resumes at 1 or 4). param_groups: the trainer state's."""
    folder = Path(ckpt) / SHARDS
    reader = _ShardReader(folder)
    # the index's checks first: a damaged or planted index is named, not blamed on the settings
    stored = reader.read_metadata().state_dict_metadata
    weights, optim = sharded_state(model, optimizer)  # the optimizer's state made (zeros) to be read into
    wanted = {f"model.{k}": t for k, t in weights.items()} | {
        f"optimizer.{name}.{k}": t for name, moments in optim["state"].items() for k, t in moments.items()}
    for key, t in wanted.items():
        _check_entry(folder, key, stored.get(key), tuple(t.shape), "the model and optimizer being resumed")
    try:
        with _alone_is_fine():
            dcp.load({"model": weights, "optimizer": optim["state"]}, storage_reader=reader)
        raw = unwrap(model)
        if isinstance(raw, GPT) and raw.cfg.tie_embeddings:  # stored once; the model's state names both
            weights["lm_head.weight"] = weights["tok_emb.weight"]
        set_state_dict(raw, optimizer, model_state_dict=weights,
                       optim_state_dict={"state": optim["state"], "param_groups": param_groups})
    except (CheckpointException, ValueError, KeyError) as e:
        # (chained: a rank that is gone, inside torch's CheckpointException, is still seen as one by the caller;
        # the settings were compared with the checkpoint's before, so what fails here is the checkpoint)
        raise CheckpointError(f"{folder} cannot be read ({_reason(e)}): it is damaged; move it out of "
                              f"{CHECKPOINTS}/ to resume from the one before") from e


def read_sharded_state(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded checkpoint, in one process, in lumen's names (what model.safetensors
    holds for an unsharded one). Each tensor is allocated once, at its full size, after its shape is checked
    against config.json; every rank's pieces are then read into place, so no second copy is ever held.

        >>> state = read_sharded_state("runs/fsdp/checkpoints/step-000500")   # doctest: +SKIP
        >>> model = GPT.from_state(ModelConfig.load(".../config.json"), state)
    """
    verify(ckpt)  # every file as the manifest lists it, and all of one checkpoint
    folder = Path(ckpt) / SHARDS
    cfg = ModelConfig.load(Path(ckpt) / CONFIG)
    reader = _ShardReader(folder)
    stored = reader.read_metadata().state_dict_metadata
    layers = {k.split(".")[2] for k in stored if k.startswith("model.blocks.")}
    if len(layers) != cfg.n_layers:  # before a template of cfg is built: a config claiming 10^9 blocks builds none
        raise CheckpointError(f"{folder} holds {len(layers)} blocks but {CONFIG} says n_layers = {cfg.n_layers}")
    template = GPT.template(cfg).state_dict()
    state = {}
    for name, want in template.items():
        if cfg.tie_embeddings and name == "lm_head.weight":
            continue
        md = _check_entry(folder, f"model.{name}", stored.get(f"model.{name}"), tuple(want.shape), CONFIG)
        state[name] = torch.empty(md.size, dtype=md.properties.dtype)
    try:
        with _alone_is_fine():
            dcp.load({"model": state}, storage_reader=reader, no_dist=True)
    except CheckpointException as e:  # a damaged shard fails anywhere in torch's reader, as trainer.pt does
        raise CheckpointError(f"{folder} cannot be read ({_reason(e)}): it is damaged; use an earlier "
                              f"checkpoint") from None
    return state


def _check_entry(folder: Path, key: str, md: object, shape: tuple, wanted_by: str
                 ) -> dcp_metadata.TensorStorageMetadata:
    """An index entry is a floating-point tensor of the shape `wanted_by` needs, whose pieces tile it whole
    (each inside it): checked before anything is allocated or read."""
    name = key.removeprefix("model.")
    if not isinstance(md, dcp_metadata.TensorStorageMetadata) or tuple(md.size) != shape:
        found = tuple(md.size) if isinstance(md, dcp_metadata.TensorStorageMetadata) else "nothing"
        raise CheckpointError(f"{folder}: {name} is {found}, but {wanted_by} needs {shape}; the shards and "
                              f"{CONFIG} belong to different models, or the index is damaged")
    if not md.properties.dtype.is_floating_point:
        raise CheckpointError(f"{folder}: {name} has dtype {md.properties.dtype}; weights must be floating point")
    inside = all(len(c.offsets) == len(c.sizes) == len(shape) and all(
        0 <= o and 0 <= n and o + n <= d for o, n, d in zip(c.offsets, c.sizes, shape)) for c in md.chunks)
    if not inside or sum(math.prod(c.sizes) for c in md.chunks) != math.prod(shape):
        raise CheckpointError(f"{folder}: the pieces of {name} do not make up the whole tensor; the index is "
                              f"damaged")
    return md


def failures(e: CheckpointException) -> list[BaseException]:
    """The exceptions of the ranks that failed, which torch.distributed.checkpoint gathers into one."""
    return [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]


def _reason(e: BaseException) -> str:
    """The first line of what went wrong (inside torch's CheckpointException: the first failed rank's), without
    torch's advice on loading the file with weights_only=False (which would let a damaged or planted file run
    code): what its safe reader met instead."""
    if isinstance(e, CheckpointException) and failures(e):
        e = failures(e)[0]
    text = str(e).strip()
    if text.startswith("Weights only load failed"):
        found = re.search(r"WeightsUnpickler error:\s*(\S.*)", text) or re.search(r"load failed\. (?!In PyTorch)(\S.*)",
                                                                               text)
        return f"not tensors torch reads safely: {found.group(1).strip()[:120] if found else 'an unknown record'}"
    first = (text.splitlines() or [""])[0] or type(e).__name__
    return re.split(r"(?<=\w)\. (?=[A-Z])", first)[0][:160]  # its first sentence (torch's go on with advice)


@contextlib.contextmanager
def _alone_is_fine():
    """torch.distributed.checkpoint warns each time one process reads or writes without a process group:
    lumen means it then (a single-process run, or loading a run to use it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")
        yield


class _ShardReader(dcp.FileSystemReader):
    """torch.distributed.checkpoint's reader, except that its index (.metadata, a pickle) is read by an
    unpickler that builds only the index's own record types, never arbitrary objects, and that an index may
    name tensors only: torch reads an entry marked as bytes with torch.load(weights_only=False), which runs any
    pickle planted in a shard. lumen writes tensors only, so a run directory from elsewhere cannot run code.
    (The tensors themselves are read with torch.load(weights_only=True).)"""

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        path = Path(self.path) / ".metadata"
        try:
            md = _IndexUnpickler(io.BytesIO(path.read_bytes())).load()
        except FileNotFoundError:
            raise MissingFileError(f"{path} is missing: the checkpoint was not completely written") from None
        except Exception as e:  # noqa: BLE001 - a damaged pickle fails anywhere in the unpickler (as trainer.pt does)
            reason = (str(e).splitlines() or [type(e).__name__])[0][:160]
            raise CheckpointError(f"{path} is damaged or not a checkpoint index lumen reads ({reason})") from None
        if not isinstance(md, dcp_metadata.Metadata) or not all(
                isinstance(info, _StorageInfo) and "/" not in info.relative_path and info.relative_path != ".."
                for info in (md.storage_data or {}).values()):
            raise CheckpointError(f"{path} is not the index of a checkpoint in this folder")
        for name, entry in md.state_dict_metadata.items():
            if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
                raise CheckpointError(f"{path} marks {name!r} as {type(entry).__name__}, not a tensor: torch would "
                                      f"unpickle it, which can run code. lumen's shards hold tensors only; this "
                                      f"index is damaged or planted: use an earlier checkpoint")
        if any(info.transform_descriptors for info in md.storage_data.values()):
            raise CheckpointError(f"{path} names stream transforms lumen never writes; the index is damaged")
        md.storage_meta = md.storage_meta or dcp_metadata.StorageMeta()  # as torch's own reader does
        md.storage_meta.load_id = self.load_id
        return md

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """torch's reading, after a second wall: no request may ask for bytes (which torch would unpickle)."""
        if any(item.type == LoadItemType.BYTE_IO for item in plan.items):
            raise CheckpointError(f"{self.path}: a request reads an entry as bytes, which torch would unpickle; "
                                  f"lumen's shards hold tensors only")
        return super().read_data(plan, planner)


class _ShardWriter(dcp.FileSystemWriter):
    """torch.distributed.checkpoint's writer, whose index records the checkpoint's id (as its save id)."""

    def __init__(self, path: Path, checkpoint_id: str):
        super().__init__(path)
        self.lumen_id = checkpoint_id

    def storage_meta(self) -> dcp_metadata.StorageMeta:
        return dcp_metadata.StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.lumen_id)


class _IndexUnpickler(pickle.Unpickler):
    """Builds the record types of a torch.distributed.checkpoint index and nothing else."""

    RECORDS = {("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")} | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
        ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.RECORDS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which no checkpoint index holds")
