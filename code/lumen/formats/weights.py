"""What every format reader returns (`Weights`), reading safetensors files (the only weight format lumen reads
from disk besides GGUF; never pickles), and the checks every state dict of weights passes, whatever file it came
from: an allow-list of dtypes, one unembedding."""

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

    quantized: for `read_gguf(path, quantized=True)` only, the Q8_0/Q4_1 matrices kept as the file's blocks,
    (codes, scale, minimum) by parameter name (not in `state`); lumen.fast builds layers from them."""

    cfg: ModelConfig
    state: dict[str, torch.Tensor]
    source: str
    tokenizer: Tokenizer | None = None
    sampling: Sampling | None = None
    quantized: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)

# the dtypes weights are kept in as stored (GPT.from_state casts them to the dtype asked for)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# 8-bit floats: torch computes nothing in them (not even isfinite), and every one of their values is a float32
# value, so they are widened to float32 exactly. (A float8 checkpoint whose scales are separate tensors is not
# a model lumen holds: those tensors are unexpected names, refused by GPT.from_state.)
WIDENED = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                                           "float8_e8m0fnu") if hasattr(torch, n))


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file, on the CPU, float8 widened (`check_dtypes`); a missing, truncated
    or damaged file is one clear error naming it (the library's own errors never reach the user).

        >>> read_safetensors("runs/x/checkpoints/step-100/model.safetensors")   # doctest: +SKIP
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no weights file at {path}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ModelFileError(
            f"{path} is not a readable safetensors file ({reason}): it is truncated or damaged; "
            "write, convert or download it again"
        ) from None
    return check_dtypes(tensors, str(path), strict=False)


def check_dtypes(state: dict[str, torch.Tensor], source: str, strict: bool = True) -> dict[str, torch.Tensor]:
    """The allow-list of weight dtypes: float32, float16, bfloat16 and float64 as they are, the float8 kinds
    widened to float32 (exactly); any other dtype (integers, bool, complex, packed float4) is refused naming the
    tensor, or with strict=False passed on (a file may hold integer buffers lumen never reads, such as old
    GPT-2 attention masks: GPT.from_state refuses them if they are weights).

        >>> check_dtypes({"w": torch.zeros(2, dtype=torch.float8_e4m3fn)}, "x")["w"].dtype
        torch.float32
    """
    out = {}
    for name, t in state.items():
        if t.dtype in WIDENED:
            t = t.to(torch.float32)
        elif t.dtype not in FLOAT_DTYPES and strict:
            raise ModelFileError(f"{source}: tensor {name} has dtype {str(t.dtype).removeprefix('torch.')}; weights "
                                 "must be float32, float16, bfloat16 or float64 (float8 is widened to float32)")
        out[name] = t
    return out


def check_one_unembedding(cfg: ModelConfig, state: dict[str, torch.Tensor], source: str) -> None:
    """A model whose config ties the unembedding to the embedding holds one matrix for both: a state that also
    carries a separate lm_head.weight which differs from tok_emb.weight is refused (loading would silently drop
    it, and the model would not be the one that was saved). A copy equal to the embedding is harmless.

        >>> cfg = ModelConfig.from_name("baby-gpt")
        >>> check_one_unembedding(cfg, {"tok_emb.weight": torch.ones(2), "lm_head.weight": torch.ones(2)}, "x")
    """
    head, emb = state.get("lm_head.weight"), state.get("tok_emb.weight")
    if not cfg.tie_embeddings or head is None or emb is None or head is emb:
        return
    if head.shape != emb.shape or not torch.equal(head.to(emb.dtype), emb):
        raise ModelFileError(
            f"{source}: the config ties the unembedding to the embedding (tie_embeddings) but the weights also hold a "
            "separate lm_head.weight that differs from tok_emb.weight; set tie_embeddings (a Hugging Face config's "
            "tie_word_embeddings) to false to load it, or drop it from the file"
        )
