"""docs/families.md, generated from the presets: one row per model family, one column per detail in which the
families differ (which norm, where it sits, which MLP, how positions are encoded, ...), each detail linked to the
chapter's section and to the class that implements it. The chapter: the differences between models "are in the
details, not in this skeleton"; this page is those details, read off the presets themselves.

    python -m lumen.families docs/families.md      # write the page (tests/test_families.py checks it is current)
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path

from . import attention, block
from .config import PRESETS, ModelConfig
from .errors import LumenError

ROOT = Path(__file__).resolve().parents[2]


def _where(obj: object) -> str:
    """A markdown link to an object's definition, relative to docs/ (its line, read from the code now)."""
    path = Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT)  # type: ignore[arg-type]
    line = inspect.getsourcelines(obj)[1]  # type: ignore[arg-type]
    return f"[`{obj.__qualname__}`](../{path}#L{line})"  # type: ignore[attr-defined]


def _norm(c: ModelConfig) -> str:
    return {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "rmsnorm_offset": "RMSNorm (1 + g)"}[c.norm]


def _placement(c: ModelConfig) -> str:
    return {"pre": "pre-LN", "post": "post-LN", "parallel": "parallel", "parallel_shared": "parallel, one norm",
            "branch_output": "branch output", "sandwich": "sandwich"}[c.norm_placement]


def _mlp(c: ModelConfig) -> str:
    if c.n_experts is not None:
        return f"{c.n_experts} SwiGLU experts, top {c.experts_per_token}" + (", renormalised" * c.norm_topk_prob)
    act = {"gelu": "GELU", "gelu_tanh": "GELU (tanh)", "relu": "ReLU", "silu": "SiLU"}[c.activation]
    return {"mlp": f"MLP, {act}", "swiglu": "SwiGLU", "geglu": f"GeGLU ({act})"}[c.mlp]


def _positions(c: ModelConfig) -> str:
    if c.positions == "learned":
        return "learned"
    parts = ["RoPE" + (" (interleaved pairs)" if c.rope_interleaved else "")]
    if c.rotary_fraction != 1.0:
        parts.append(f"on {c.rotary_fraction:g} of each head")
    if c.rope_scaling is not None:
        parts.append(f"{c.rope_scaling.kind} scaling x{c.rope_scaling.factor:g}")
    if c.rope_local_theta is not None:
        parts.append(f"base {c.rope_local_theta:g} local, {c.rope_theta:g} global")
    if not all(c.rope_layers):
        parts.append(f"none on {c.rope_layers.count(False)} of every {len(c.rope_layers)} blocks")
    return ", ".join(parts)


def _heads(c: ModelConfig) -> str:
    return "MHA" if c.kv_heads == c.n_heads else "MQA" if c.kv_heads == 1 else "GQA"


def _windows(c: ModelConfig) -> str:
    if c.sliding_window is None:
        return "-"
    if c.layer_types is None:
        return f"all {c.sliding_window}"
    local = c.layer_types.count("sliding")
    return f"{c.sliding_window} on {local} of every {len(c.layer_types)} blocks"


def _qk(c: ModelConfig) -> str:
    return {None: "-", "head": "per head", "projection": "whole projection"}[c.qk_norm]


def _caps(c: ModelConfig) -> str:
    caps = [f"scores {c.attn_softcap:g}" if c.attn_softcap else "", f"logits {c.final_softcap:g}" if c.final_softcap
            else ""]
    return ", ".join(x for x in caps if x) or "-"


def _scale(c: ModelConfig) -> str:
    return "1/sqrt(d_head)" if c.query_pre_attn_scalar is None else f"1/sqrt({c.query_pre_attn_scalar:g})"


def _embeddings(c: ModelConfig) -> str:
    return ("tied" if c.tie_embeddings else "untied") + (", x sqrt(d)" if c.scale_embeddings else "")


# column: (how a config shows it, the chapter's section, the classes that implement it)
COLUMNS: dict[str, tuple[Callable[[ModelConfig], str], str, tuple[object, ...]]] = {
    "norm": (_norm, "What LayerNorm does", (block.LayerNorm, block.RMSNorm, block.OffsetRMSNorm)),
    "placement": (_placement, "Pre-LN vs post-LN", (block.TransformerBlock, block.PostLNBlock, block.ParallelBlock,
                                                    block.SharedNormParallelBlock, block.BranchOutputNormBlock,
                                                    block.SandwichBlock)),
    "MLP": (_mlp, "Expand, squash, project back; GELU, and why not ReLU",
            (block.MLP, block.SwiGLU, block.GeGLU, block.MixtureOfExperts)),
    "positions": (_positions, "The full transformer block", (attention.RoPE, attention.InterleavedRoPE)),
    "heads": (_heads, "The full transformer block", (attention.MultiHeadAttention,)),
    "windows": (_windows, "The full transformer block", (attention.visible,)),
    "q/k norm": (_qk, "What LayerNorm does", (block.qk_norms, block.ProjectionRMSNorm)),
    "soft-cap": (_caps, "The logit lens", (attention.SoftCap,)),
    "query scale": (_scale, "The full transformer block", (attention.MultiHeadAttention,)),
    "embeddings": (_embeddings, "Parameter accounting per block", (block.TransformerBlock,)),
}


def family_of(cfg: ModelConfig) -> str:
    """The Hugging Face architecture a preset is written as (lumen's own shape for those none holds)."""
    from .formats.hf import family

    try:
        return family(cfg)
    except LumenError:
        return "lumen"


def page() -> str:
    """The text of docs/families.md."""
    rows: dict[str, list[str]] = {}
    for name, cfg in PRESETS.items():
        rows.setdefault(family_of(cfg), []).append(name)
    out = [
        "# Model families: the details that differ",
        "",
        "Generated from the presets by `python -m lumen.families docs/families.md` (`code/lumen/families.py`); a test",
        "checks it is current. One row per family (the Hugging Face architecture its presets are written as), one",
        "column per detail, with every value the family's presets take (`;` between them); `lumen count PRESET`",
        "gives a preset's parameters. Each column's chapter section and classes are listed below the table.",
        "",
        "| family | presets | " + " | ".join(f"[{k}](#{_anchor(k)})" for k in COLUMNS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |",
    ]
    for fam, names in rows.items():
        cells = ["; ".join(dict.fromkeys(show(PRESETS[n]) for n in names)) for show, _, _ in COLUMNS.values()]
        out.append(f"| {fam} | {', '.join(f'`{n}`' for n in names)} | " + " | ".join(cells) + " |")
    out += ["", "## The details", ""]
    for k, (_, section, impl) in COLUMNS.items():
        out += [f"### {k}", "", f"Chapter: *{section}*. Code: {', '.join(_where(o) for o in impl)}.", ""]
    return "\n".join(out)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped."""
    return "".join(ch for ch in heading.lower().replace(" ", "-") if ch.isalnum() or ch in "-_")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = page() + "\n"
    if args:
        Path(args[0]).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
