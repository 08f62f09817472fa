"""`lumen convert MODEL --to hf OUTDIR`: write a model as a Hugging Face directory (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) that transformers and lumen both load."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import UserError
from .models import DTYPES, add_model_argument, load_model, path_text

FORMATS = ("hf",)


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="convert a model to another format (a Hugging Face directory)")
    add_model_argument(p)
    p.add_argument("outdir", type=path_text, help="the directory to create (must not exist or be empty)")
    p.add_argument("--to", choices=FORMATS, required=True, help="the output format")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="precision of the written weights")
    return p


def run(args: argparse.Namespace) -> int:
    from ..files import check_writable
    from ..formats.hf import save_hf_dir

    out = Path(args.outdir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty directory (choose a new output directory)")
    check_writable(out, "OUTDIR")  # (before the model is loaded: a path under a file, or /proc, fails now)
    loaded = load_model(args.model, args.dtype)
    save_hf_dir(loaded.model, out, loaded.tokenizer)  # staged beside OUTDIR, renamed into place at the end
    print(f"wrote {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return 0
