"""One loader for every model spec: a known name, a GGUF file, a Hugging Face directory, a lumen run.

    >>> loaded = load("smollm2")                         # doctest: +SKIP
    >>> loaded.model, loaded.tokenizer                   # a lumen GPT in eval mode, its tokenizer

Specs, tried in this order:
  smollm2                  a named pretrained model, fetched once into lumen's cache (see MODELS)
  path/to/model.gguf       a llama.cpp GGUF file (Llama family)
  path/to/hf-dir           config.json with a `model_type` + *.safetensors (tokenizer.json if present)
  hf:ORG/NAME[@REVISION]   a Hugging Face hub model, from (or downloaded into) the standard HF cache
  path/to/run-or-step-dir  a lumen training run or checkpoint directory

Every format is read into the same `Weights` (config, tensors in lumen's names, tokenizer, sampling
defaults) by `read`, and built into a GPT in one place, `GPT.from_state`, with the device and dtype
applied there once. The model holds the chapter's own classes (nn.Linear, the chapter's norms and MLPs):
what a reader reads in block.py is what runs. Speed (packed layouts, a GGUF's quantized blocks) is
lumen.fast's, asked for explicitly.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import LumenError, MissingFileError, UserError
from ..files import read_json
from ..model import GPT
from ..tokenizers import FILENAME as TOKENIZER_FILE
from ..tokenizers import Tokenizer
from .weights import Weights, check_one_unembedding

# named models -> the lumen.fetch artifact holding their GGUF file
MODELS = {"smollm2": "smollm2"}

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


def load(spec: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Loaded:
    """The model and tokenizer a spec names (see the module docstring), on `device`, its weights in `dtype`."""
    spec = str(spec)
    w = read(spec)
    return Loaded(build(w, device, dtype), w.tokenizer, spec)


def build(w: Weights, device: str | torch.device | None = "cpu", dtype: torch.dtype | None = torch.float32,
          parts: dict[str, torch.nn.Module] | None = None) -> GPT:
    """The GPT that read weights describe (GPT.from_state), with their sampling defaults."""
    check_one_unembedding(w.cfg, w.state, w.source)
    model = GPT.from_state(w.cfg, w.state, w.source, device, dtype, parts)
    model.sampling = w.sampling
    return model


def read(spec: str, quantized: bool = False) -> Weights:
    """What a spec's files hold, read and checked but not built. quantized=True: a GGUF's quantized matrices
    stay as the file's blocks (lumen.fast.load_quantized builds from them); any other spec is refused then."""
    kind, path = resolve(spec)
    if quantized and kind != "gguf":
        raise UserError(f"--weights gguf needs a GGUF model ({', '.join(MODELS)} or a .gguf file), not {spec!r}")
    if kind == "gguf":
        from .gguf import read_gguf

        w = read_gguf(path, quantized)
    elif kind == "hf":
        from .hf import read_hf_dir

        w = read_hf_dir(path)
    else:
        from .checkpoint import read_run

        w = read_run(path)
    if spec in MODELS or spec.startswith("hf:"):  # the name the user typed, not the file's
        w.cfg = w.cfg.replace(name=spec)
    return w


def read_config(spec: str) -> ModelConfig:
    """The config of the model a spec names, reading no weights (`lumen count`)."""
    cfg = _header(spec)[0]
    return cfg.replace(name=spec) if spec in MODELS or spec.startswith("hf:") else cfg


def read_tokenizer(spec: str) -> Tokenizer | None:
    """The tokenizer the model a spec names carries (None if it has none), reading no weights."""
    return _header(spec)[1]


def _header(spec: str) -> tuple[ModelConfig, Tokenizer | None]:
    kind, path = resolve(spec, config_only=True)
    if kind == "gguf":
        from .gguf import naming, read_header

        with naming(path):
            _, cfg, gguf_tok = read_header(path)
        return cfg, gguf_tok
    if kind == "hf":
        from .hf import read_hf_config

        cfg = read_hf_config(path)
        tok = Tokenizer.load(path) if (path / "tokenizer.json").is_file() else None
    else:
        from .checkpoint import CONFIG
        from .checkpoint import resolve as checkpoint_of

        ckpt = checkpoint_of(path)
        cfg = ModelConfig.load(ckpt / CONFIG)
        tok = Tokenizer.load(ckpt / TOKENIZER_FILE) if (ckpt / TOKENIZER_FILE).is_file() else None
    if tok is not None:
        tok.check_fits(cfg.vocab_size, str(path))
    return cfg, tok


def resolve(spec: str, config_only: bool = False) -> tuple[str, Path]:
    """Which format a spec is ("gguf", "hf" or "run") and the file or folder that holds it: a named model
    is fetched into lumen's cache, an hf: spec into the Hugging Face cache (with config_only, only its
    config and tokenizer files)."""
    path = Path(spec)
    if spec.startswith("hf:"):  # a hub model: its snapshot folder in the Hugging Face cache is an HF directory
        from .hf import HUB_FILES, hub_snapshot

        return "hf", hub_snapshot(spec.removeprefix("hf:"), ["*.json"] if config_only else HUB_FILES)
    if spec in MODELS and not path.exists():
        from ..fetch import fetch

        return "gguf", fetch(MODELS[spec])
    if path.suffix == ".gguf" and path.is_file():
        return "gguf", path
    if path.is_dir():
        return ("hf" if _is_hf_dir(path) else "run"), path
    raise unknown_spec(spec)


def unknown_spec(spec: str, names: tuple[str, ...] = tuple(MODELS), forms: str = SPEC_FORMS) -> LumenError:
    """The error for a spec that names nothing lumen can load: for a path, the first part of it that does not
    exist and the closest existing name there (a mistyped run directory: `runs/shakespear`, did you mean
    runs/shakespeare?); for a bare word, the closest of `names`. `forms` lists what a spec may be.

        >>> str(unknown_spec("smollm3")).split(":")[0]
        "unknown model 'smollm3' (did you mean smollm2?)"
    """
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
