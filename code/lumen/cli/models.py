"""What the subcommands share: the model argument and its loading (failures as one-line errors), and the
text the inspection tools read (a corpus cut into windows of tokens)."""

from __future__ import annotations

import argparse

import torch

from . import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODEL_HELP = "smollm2, a .gguf file, a Hugging Face directory or a lumen run directory"


def add_model_argument(p: argparse.ArgumentParser, help: str = MODEL_HELP) -> None:
    p.add_argument("model", help=help)


def add_text_arguments(p: argparse.ArgumentParser, seq_len: int, windows: int | None = None) -> None:
    """--corpus, --seq-len, --seed (and --windows when given a default): the text a tool reads."""
    p.add_argument("--corpus", default="shakespeare", help="text files/directories, or shakespeare (default)")
    if windows is not None:
        p.add_argument("--windows", type=int, default=windows, help=f"text windows to read (default {windows})")
    p.add_argument("--seq-len", type=int, default=seq_len, help=f"tokens per window (default {seq_len})")
    p.add_argument("--seed", type=int, default=0)


def read_windows(model, tok, args: argparse.Namespace, split: str, count: int, seed: int) -> torch.Tensor:
    """count windows of args.seq_len tokens of args.corpus (its train or val split), within the model's context."""
    from ..inspect.corpus import token_windows

    if args.seq_len > model.cfg.context:
        raise UserError(f"--seq-len {args.seq_len} exceeds the model's context of {model.cfg.context}")
    return token_windows(tok, args.corpus, split, count, args.seq_len, seed)


def load_model(spec: str, dtype: str = "float32", weights: str = "float"):
    """lumen.formats.load(spec), turning a failed download into a UserError."""
    from ..fetch import FetchError
    from ..formats import load

    try:
        return load(spec, dtype=DTYPES[dtype], weights=weights)
    except FetchError as e:
        raise UserError(str(e)) from None


def load_with_tokenizer(spec: str, dtype: str = "float32"):
    """(model, tokenizer) of a spec, for the tools that read text: a spec without a tokenizer is an error."""
    loaded = load_model(spec, dtype)
    if loaded.tokenizer is None:
        raise UserError(f"{spec} has no tokenizer saved with it (the tools need one to read text)")
    return loaded.model, loaded.tokenizer
