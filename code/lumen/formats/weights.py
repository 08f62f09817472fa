"""What every format reader returns (`Weights`), and reading safetensors files: the only weight format
lumen reads from disk besides GGUF (never pickles)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import ModelConfig
from ..decode import Sampling
from ..errors import MissingFileError, ModelFileError
from ..tokenizers import Tokenizer


@dataclass
class Weights:
    """A model as its files hold it, read but not yet built: the config, the tensors in lumen's parameter
    names, the tokenizer and sampling defaults if the files carry them, and `source` (a file or folder, for
    messages). `GPT.from_state` builds the model (lumen.formats.load does, once for every format).

    blocks: for `read_gguf(path, blocks=True)` only, the Q8_0/Q4_1 matrices kept as the file's blocks,
    (codes, scale, minimum) by parameter name (not in `state`); lumen.fast builds layers from them."""

    cfg: ModelConfig
    state: dict[str, torch.Tensor]
    source: str
    tokenizer: Tokenizer | None = None
    sampling: Sampling | None = None
    blocks: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)


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
