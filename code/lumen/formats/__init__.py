"""One loader for every model spec: a known name, a GGUF file, a Hugging Face directory, a lumen run.

    >>> loaded = load("smollm2")                         # doctest: +SKIP
    >>> loaded.model, loaded.tokenizer                   # a lumen GPT in eval mode, its tokenizer

Specs, tried in this order:
  smollm2                  a named pretrained model, fetched once into lumen's cache (see MODELS)
  path/to/model.gguf       a llama.cpp GGUF file (Llama family)
  path/to/hf-dir           config.json with a `model_type` + *.safetensors (tokenizer.json if present)
  hf:ORG/NAME[@REVISION]   a Hugging Face hub model, from (or downloaded into) the standard HF cache
  path/to/run-or-step-dir  a lumen training run or checkpoint directory
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import LumenError, MissingFileError, UserError
from ..files import read_json
from ..model import GPT
from ..tokenizers import Tokenizer

# named models -> the lumen.fetch artifact holding their GGUF file
MODELS = {"smollm2": "smollm2"}

WEIGHTS = ("float", "gguf")  # how a GGUF's quantized matrices are held: dequantized, or as the file's blocks

SPEC_FORMS = (
    f"a model name ({', '.join(MODELS)}), a .gguf file, a Hugging Face directory "
    "(config.json + model.safetensors), hf:ORG/NAME (the Hugging Face hub), or a lumen run/checkpoint directory"
)


@dataclass
class Loaded:
    """A model ready to use: the GPT (eval mode), its tokenizer (None if the run saved none), the spec."""

    model: GPT
    tokenizer: Tokenizer | None
    spec: str


def load(spec: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
         weights: str = "float") -> Loaded:
    """The model and tokenizer a spec names; see the module docstring for the accepted forms.

    weights="gguf" keeps a GGUF file's Q8_0/Q4_1 matrices as the file's blocks (lumen.quant: a fifth of
    float32's memory; a prompt's rows computed in float32, a decoded token's as llama.cpp computes it, its x
    rounded to 8 bits per block); "float" (the default) dequantizes them.

    One explicit step after reading: `packing.fast_linears` turns the linear layers into FastLinear ones
    (the same parameters, no extra memory), whose one-row products compile into fused loops and whose
    weights `packing.packed(model)` can move into oneDNN's layout for eager decoding."""
    from ..packing import fast_linears

    if weights not in WEIGHTS:
        raise UserError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if weights == "gguf":
        if dtype != torch.float32:
            raise UserError("--weights gguf computes in float32 from the file's blocks (drop --dtype)")
        from .gguf import load_gguf_quantized

        model, tok = load_gguf_quantized(_gguf_path(spec))
        return Loaded(model.to(device), tok, spec)
    model, tok = _load(spec, device, dtype)
    model = model.to(device=device, dtype=dtype).eval()
    fast_linears(model)
    return Loaded(model, tok, spec)


def _gguf_path(spec: str) -> Path:
    """The GGUF file a spec names: a named model's cached file or a .gguf path."""
    path = Path(spec)
    if spec in MODELS and not path.exists():
        from ..fetch import fetch

        return fetch(MODELS[spec])
    if path.suffix == ".gguf":
        if not path.is_file():
            raise MissingFileError(f"no GGUF file at {path}")
        return path
    raise UserError(f"--weights gguf needs a GGUF model ({', '.join(MODELS)} or a .gguf file), not {spec!r}")


def _load(spec: str, device: str | torch.device, dtype: torch.dtype) -> tuple[GPT, Tokenizer | None]:
    from . import gguf

    path = Path(spec)
    if spec.startswith("hf:"):  # a hub model: its snapshot folder in the Hugging Face cache is an HF directory
        from .hf import hub_snapshot, load_hf_dir

        path = hub_snapshot(spec.removeprefix("hf:"))
        has_tokenizer = (path / "tokenizer.json").is_file()
        model = load_hf_dir(path, device, dtype)
        model.cfg = model.cfg.replace(name=spec)
        return model, Tokenizer.load(path) if has_tokenizer else None
    if spec in MODELS and not path.exists():
        from ..fetch import fetch

        model, tok = gguf.load_gguf(fetch(MODELS[spec]), device, dtype)
        model.cfg = model.cfg.replace(name=spec)
        return model, tok
    if path.suffix == ".gguf":
        if not path.is_file():
            raise MissingFileError(f"no GGUF file at {path}")
        return gguf.load_gguf(path, device, dtype)
    if path.is_dir() and _is_hf_dir(path):
        from .hf import load_hf_dir

        model = load_hf_dir(path, device, dtype)
        if not (path / "tokenizer.json").is_file():  # (with its tokenizer_config.json, read by load)
            return model, None
        tok = Tokenizer.load(path)
        tok.check_fits(model.cfg.vocab_size, str(path / "tokenizer.json"))
        return model, tok
    if path.is_dir():
        from .checkpoint import load_run

        return load_run(path, device)
    raise unknown_spec(spec)


def unknown_spec(spec: str, names: tuple[str, ...] = tuple(MODELS), forms: str = SPEC_FORMS) -> LumenError:
    """The error for a spec that names nothing lumen can load: for a path, the first part of it that does not
    exist and the closest existing name there (a mistyped run directory: `runs/shakespear`, did you mean
    runs/shakespeare?); for a bare word, the closest of `names`. `forms` lists what a spec may be.

        >>> str(unknown_spec("smollm3")).split(":")[0]
        "unknown model 'smollm3' (did you mean smollm2?)"
    """
    import difflib

    path = Path(spec)
    if path.exists():
        what = "folder" if path.is_dir() else "file"
        return UserError(f"{spec} is a {what} lumen cannot read as a model: give {forms}")
    if len(path.parts) > 1 or spec.startswith("."):
        parts = path.parts
        i = next(i for i in range(len(parts), 0, -1) if Path(*parts[:i]).exists()) if Path(parts[0]).exists() else 0
        base = Path(*parts[:i]) if i else Path(".")
        missing, rest = parts[i], parts[i + 1:]
        try:
            entries = [p.name for p in base.iterdir()] if base.is_dir() else []
        except OSError:
            entries = []
        close = difflib.get_close_matches(missing, entries, n=1, cutoff=0.6)
        hint = f" (did you mean {Path(base, close[0], *rest) if i else Path(close[0], *rest)}?)" if close else ""
        return MissingFileError(f"no model at {spec}: {base if i else 'this folder'} has no {missing!r}{hint}")
    close = difflib.get_close_matches(spec, list(names), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return UserError(f"unknown model {spec!r}{hint}: give {forms}")


def _is_hf_dir(path: Path) -> bool:
    """A Hugging Face config.json names its `model_type`; lumen's own config.json does not."""
    config = path / "config.json"
    if not config.is_file():
        return False
    return "model_type" in read_json(config, "model config")


def chat_prompt(tok: Tokenizer, user_text: str) -> str:
    """The model's chat template (Jinja, sandboxed and bounded: tokenizers.ChatTemplate) applied to one user
    message, ready for the reply."""
    template = getattr(tok, "chat", None)
    if template is None:
        raise UserError("this model's tokenizer has no chat template (drop --chat and give a plain prompt)")
    return template.render(user_text)
