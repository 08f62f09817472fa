"""Loading a model spec for a subcommand: the library's loader, with its failures as one-line errors."""

from __future__ import annotations

import torch

from . import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(spec: str, dtype: str = "float32"):
    """lumen.formats.load(spec), turning a failed download into a UserError."""
    from ..fetch import FetchError
    from ..formats import load

    try:
        return load(spec, dtype=DTYPES[dtype])
    except FetchError as e:
        raise UserError(str(e)) from None


def load_with_tokenizer(spec: str, dtype: str = "float32"):
    """(model, tokenizer) of a spec, for the tools that read text: a spec without a tokenizer is an error."""
    loaded = load_model(spec, dtype)
    if loaded.tokenizer is None:
        raise UserError(f"{spec} has no tokenizer saved with it (the tools need one to read text)")
    return loaded.model, loaded.tokenizer
