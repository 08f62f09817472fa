"""Reading safetensors files: the only weight format lumen reads from disk besides GGUF (never pickles)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import MissingFileError, ModelFileError


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file, on the CPU; a missing, truncated or damaged file is one
    clear error naming it (the library's own errors never reach the user).

        >>> read_safetensors("runs/x/checkpoints/step-100/model.safetensors")   # doctest: +SKIP
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no weights file at {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ModelFileError(
            f"{path} is not a readable safetensors file ({reason}): it is truncated or damaged; "
            "write, convert or download it again"
        ) from None
