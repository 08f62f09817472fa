"""A receipt a user can run on their own model: lumen's forward pass against Hugging Face transformers' on the
same weights and the same tokens (`lumen verify`): `verify("path/to/hf-dir", {"built-in": FIXED_TEXT})` is a
Receipt, whose `passed` says whether every comparison is within its noise floor.

For each text: the largest |difference| between the two models' logits, that divided by the largest |logit| of
transformers' (the relative error, the figure the noise floors are stated in), the mean KL divergence of lumen's
next-token distribution from transformers', the share of positions whose top-1 token agrees, and each model's
greedy continuation (every step from its own previous choices, so one divergence shows as two different tails).
The noise floors are float32's rounding after a forward pass (5e-5 relative) and bfloat16's (1e-2); in float32
the greedy tokens must agree too. For a GGUF file the reference is transformers' own reading of the file
(`gguf_file=`): the dequantized weights are the same, so the two agree to float32 rounding as well.

For a GGUF file, when llama-cpp-python is installed, llama.cpp's own logits are a second reference: its forward
pass on the file as llama.cpp runs it (its matrix products, its KV cache, its RoPE), against lumen's forward pass
on the dequantized weights. llama.cpp does not compute what lumen does to float32 rounding on every file: a
float16 or bfloat16 matrix multiplies activations rounded to 16 bits, a quantized one activations rounded to
8 bits per block of 32 (q8_0, q8_1, q8_K). So its noise floor goes by the file's matrix types
(LLAMA_CPP_FLOORS, measured); the greedy tokens must agree on a float32 file and are reported on the others.
A file transformers cannot read (no GGUF reading of its architecture) is then verified against llama.cpp alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError

# the relative error within which two forward passes of the same weights agree, by the weights' precision
THRESHOLDS = {"float32": 5e-5, "bfloat16": 1e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# the built-in text: prose, code, digits and punctuation, so that most of a tokenizer's paths are taken
FIXED_TEXT = (
    "The transformer reads a sequence of tokens and, layer after layer, adds to a residual stream what each "
    "attention head and each MLP has found. In 1998, 2024 and 3.14159: numbers too. def add(a, b):\n"
    "    return a + b  # code\n"
    "Questions? Answers! \"Quotes\", (brackets) and a list: one, two, three."
)
INSTALL = "pip install 'lumen-lm[verify]'"
TRANSFORMERS, LLAMA_CPP = "transformers", "llama.cpp"
# llama.cpp's noise floor, by the kind of matrices a GGUF file holds (`matrix_kind`): the relative error between
# lumen's forward pass and llama.cpp's (llama-cpp-python 0.3.36 on CPU, float32 KV cache) where both read the same
# weights right, measured on the built-in text (docs/formats.md, "Checking a model yourself"):
# - float32 matrices: llama.cpp multiplies in float32, in its own order of sums: float32's floor, 5e-5 (measured:
#   4e-7 on llama.cpp-converted tiny models);
# - 16-bit matrices: the activations each one multiplies are rounded to float16 (bfloat16) first: measured 3.7e-4
#   on a float16 file; bfloat16 keeps 3 bits fewer (8x that), so 1e-2, bfloat16's floor for lumen too. A float32
#   file of a GELU family (Gemma, Phi-2) is here too: llama.cpp's GELU looks its input up in a float16 table
#   (measured 2.8e-4 on a converted tiny Gemma 2);
# - quantized matrices: the activations are rounded to 8 bits per block of 32 first (q8_0, q8_1, q8_K): measured
#   3.3e-2 on SmolLM2's Q4_1 file (lumen in float64 the same: the difference is llama.cpp's rounding), so 1e-1,
#   with room for longer texts and deeper models; the KL and top-1 agreement printed beside it say more.
LLAMA_CPP_FLOORS = {"float32": 5e-5, "16-bit": 1e-2, "quantized": 1e-1}


@dataclass
class Comparison:
    """lumen against transformers on one text."""

    text: str  # which text ("fixed" or the user's file)
    tokens: int  # how many tokens both models read: the text's first ones, up to the context less the steps
    max_abs: float  # max |logit difference| over every position and vocabulary entry
    relative: float  # max_abs / max |transformers' logit|
    kl: float  # mean over positions of KL(transformers || lumen) of the next-token distributions, in nats
    top1: float  # the share of positions whose most likely next token is the same
    greedy_lumen: list[int] = field(default_factory=list)
    greedy_reference: list[int] = field(default_factory=list)
    threshold: float = THRESHOLDS["float32"]
    greedy_must_agree: bool = True
    text_tokens: int = 0  # how many tokens the whole text is
    continuation: str = ""  # lumen's greedy tokens as text
    against: str = TRANSFORMERS  # the reference: transformers, or llama.cpp (a GGUF file)

    @property
    def passed(self) -> bool:
        same = self.greedy_lumen == self.greedy_reference or not self.greedy_must_agree
        return self.relative <= self.threshold and same and math.isfinite(self.relative)


@dataclass
class Receipt:
    """Every comparison of one model, and what was compared with what."""

    spec: str
    reference: str  # what transformers read: a directory, or a GGUF file through gguf_file=
    dtype: str
    comparisons: list[Comparison]
    notes: list[str] = field(default_factory=list)  # a reference not compared against, and why

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "reference": self.reference, "dtype": self.dtype, "passed": self.passed,
                "comparisons": [asdict(c) | {"passed": c.passed} for c in self.comparisons], "notes": self.notes}


def compare(ours: torch.Tensor, reference: torch.Tensor) -> tuple[float, float, float, float]:
    """(max |Δlogit|, relative error, mean KL(reference || ours), top-1 agreement) of two (T, V) logit tensors,
    computed in float64."""
    ours, reference = ours.double(), reference.double()
    max_abs = float((ours - reference).abs().max())
    relative = max_abs / max(float(reference.abs().max()), 1e-30)
    log_p, log_q = reference.log_softmax(-1), ours.log_softmax(-1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    top1 = float((ours.argmax(-1) == reference.argmax(-1)).double().mean())
    return max_abs, relative, kl, top1


def greedy(forward, ids: list[int], steps: int) -> list[int]:
    """`steps` tokens, each the argmax of `forward` (token ids (1, T) -> logits (T, V)) after the ones before."""
    out = list(ids)
    for _ in range(steps):
        out.append(int(forward(torch.tensor([out]))[-1].argmax()))
    return out[len(ids):]


def reference_model(kind: str, path: Path, dtype: torch.dtype):
    """transformers' model of the same files: from_pretrained on the directory, or on the GGUF file."""
    try:
        import transformers
    except ImportError:
        raise UserError(f"lumen verify compares against Hugging Face transformers, which is not installed: "
                        f"{INSTALL}") from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    auto = transformers.AutoModelForCausalLM
    if kind == "hf":
        try:
            return auto.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
        except Exception as e:  # lumen read the directory; transformers' own reading of it failed
            raise UserError(f"{path}: transformers {transformers.__version__} cannot load this directory "
                            f"({type(e).__name__}: {_first_line(e)}), so there is no reference to verify "
                            "against") from None
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm  # its GGUF reading draws a progress bar no setting turns off: off while it runs
    gguf_utils.tqdm = lambda items, **_: items
    try:
        return auto.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                    attn_implementation="eager").eval()
    except Exception as e:  # the reference cannot be had: an architecture or a detail its GGUF reading lacks
        what = "architecture" if "not supported" in str(e) else "file"
        raise UserError(f"{path.name}: transformers {transformers.__version__} cannot read this GGUF {what} "
                        f"({type(e).__name__}: {_first_line(e)}), so there is no reference to verify against; "
                        "verify the Hugging Face model it was converted from instead") from None
    finally:
        gguf_utils.tqdm = bar


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def matrix_kind(path: Path) -> str:
    """Which of LLAMA_CPP_FLOORS a GGUF file's matrices make it: "quantized" if any matrix is, else "16-bit" if
    any is float16 or bfloat16, else "float32". (The token embedding is looked up, not multiplied, unless the
    file has no output.weight and it is the unembedding too.)"""
    from gguf import GGMLQuantizationType as Q

    from .gguf import open_gguf

    tensors = open_gguf(path).tensors  # (only the header is read; the mapping closes with the last view)
    names = {t.name for t in tensors}
    kinds = {t.tensor_type for t in tensors
             if len(t.shape) >= 2 and (t.name != "token_embd.weight" or "output.weight" not in names)}
    if kinds <= {Q.F32}:
        return "float32"
    return "16-bit" if kinds <= {Q.F32, Q.F16, Q.BF16} else "quantized"


def llama_cpp_rounding(path: Path, activation: str) -> str:
    """Which of LLAMA_CPP_FLOORS llama.cpp's forward pass on this file is within: its matrices' kind, and at least
    "16-bit" for a GELU (llama.cpp reads GELU(x) from a table indexed by x in float16, its value a float16)."""
    kind = matrix_kind(path)
    return "16-bit" if kind == "float32" and activation.startswith("gelu") else kind


class LlamaCpp:
    """llama.cpp's forward pass on a GGUF file, through llama-cpp-python (`Llama(..., logits_all=True)`): every
    position's logits, and a greedy continuation llama.cpp decodes with its own KV cache (kept in float32, so
    that attention adds no rounding of its own)."""

    def __init__(self, llama_cpp, path: Path, n_ctx: int):
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
            n_threads=torch.get_num_threads(), type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
            verbose=False)

    def run(self, ids: list[int], steps: int) -> tuple[torch.Tensor, list[int]]:
        """(logits (T, V) of the tokens ids, the `steps` greedy tokens after them)."""
        llm = self.llm
        llm.reset()
        llm.eval(ids)
        logits = torch.from_numpy(llm.scores[: len(ids)].copy())
        out: list[int] = []
        for step in range(steps):
            if step:
                llm.eval([out[-1]])
            out.append(int(llm.scores[llm.n_tokens - 1].argmax()))
        return logits, out


def llama_cpp_module():
    """llama-cpp-python's module, or None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def _llama_cpp(path: Path, n_ctx: int, notes: list[str]) -> LlamaCpp | None:
    """llama.cpp's reading of the file, or None with a note saying why there is none."""
    module = llama_cpp_module()
    if module is None:
        notes.append(f"llama.cpp: not compared (llama-cpp-python is not installed: {INSTALL})")
        return None
    try:
        return LlamaCpp(module, path, n_ctx)
    except Exception as e:  # llama.cpp refused the file (an architecture this build does not run, ...)
        notes.append(f"llama.cpp: not compared (llama-cpp-python {getattr(module, '__version__', '?')} cannot "
                     f"load {path.name}: {type(e).__name__}: {_first_line(e)})")
        return None


def verify(spec: str, texts: dict[str, str], dtype: str = "float32", steps: int = 32) -> Receipt:
    """lumen's model of `spec` against transformers' on each text (name -> text), and for a GGUF file against
    llama.cpp's when llama-cpp-python is installed: a Receipt."""
    from . import load, resolve  # read when called: the package imports this module (and tests replace load)

    if dtype not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kind, path = resolve(spec)
    if kind not in ("hf", "gguf"):
        raise UserError(f"{spec} is a lumen run: transformers has no reading of it to verify against; "
                        "give a Hugging Face directory, hf:ORG/NAME or a .gguf file")
    loaded = load(str(path), dtype=DTYPES[dtype])
    if loaded.tokenizer is None:
        raise UserError(f"{spec} has no tokenizer (tokenizer.json) to turn the texts into tokens; save the "
                        "model's tokenizer beside it")
    model, tokenizer = loaded.model, loaded.tokenizer

    def lumen_logits(ids: torch.Tensor) -> torch.Tensor:
        return model(ids)[0][0].float()

    def reference_logits(ids: torch.Tensor) -> torch.Tensor:
        assert reference is not None
        return reference(ids).logits[0].float()

    if not 0 <= steps < model.cfg.context:
        raise UserError(f"steps must be between 0 and {model.cfg.context - 1} (the model's context less one), "
                        f"got {steps}")
    longest = model.cfg.context - steps
    tokens = {name: tokenizer.encode(text) for name, text in texts.items()}
    for name, whole in tokens.items():
        if not whole:
            raise UserError(f"the {name} text holds no tokens")
    # the references (after every check of the input: they are slower)
    notes: list[str] = []
    llama = None
    if kind == "gguf":
        n_ctx = max(min(len(whole), longest) for whole in tokens.values()) + steps
        llama = _llama_cpp(path, n_ctx, notes)
    try:
        reference = reference_model(kind, path, DTYPES[dtype])
    except UserError as e:
        if llama is None:
            raise
        reference = None
        notes.append(f"transformers: not compared ({e})")
    floor = max(THRESHOLDS[dtype], LLAMA_CPP_FLOORS[llama_cpp_rounding(path, model.cfg.activation)]) if llama else 0.0
    exact = dtype == "float32" and floor == THRESHOLDS["float32"]
    out = []
    with torch.no_grad():
        for name, whole in tokens.items():
            ids = whole[:longest]
            batch = torch.tensor([ids])
            ours = lumen_logits(batch)
            ours_greedy = greedy(lumen_logits, ids, steps)
            found = []
            if reference is not None:
                found.append(Comparison(
                    name, len(ids), *compare(ours, reference_logits(batch)), ours_greedy,
                    greedy(reference_logits, ids, steps), THRESHOLDS[dtype], greedy_must_agree=dtype == "float32"))
            if llama is not None:
                theirs, their_greedy = llama.run(ids, steps)
                found.append(Comparison(name, len(ids), *compare(ours, theirs), ours_greedy, their_greedy, floor,
                                        greedy_must_agree=exact, against=LLAMA_CPP))
            for c in found:
                c.text_tokens, c.continuation = len(whole), tokenizer.decode(ours_greedy)
            out += found
    what = f"{path} (gguf_file=)" if kind == "gguf" else str(path)
    return Receipt(spec, what, dtype, out, notes)
