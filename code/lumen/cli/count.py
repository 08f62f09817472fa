"""`lumen count MODEL [--context L] [--json]`: parameters and FLOPs, formula beside exact.

MODEL is any model spec (smollm2, a .gguf file, a Hugging Face or lumen run directory), a preset name
(gpt2, smollm2-135m, ...: no weights needed), or a ModelConfig .json file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..accounting import report
from ..config import PRESETS, ModelConfig
from ..errors import UserError
from ..formats import MODELS, SPEC_FORMS, read_config, unknown_spec
from .models import add_model_argument


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="count parameters and FLOPs of a model (formula beside exact)",
                       description=__doc__)
    add_model_argument(p, "a preset name (gpt2, smollm2-135m, ...), a config .json file, or a model: smollm2, "
                          "a .gguf file, a Hugging Face directory or a lumen run directory")
    p.add_argument("--context", type=int, default=None,
                   help="context L for the attention core (default: the model's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def resolve_config(spec: str) -> ModelConfig:
    """A preset name, a ModelConfig .json file, or any model spec (its config alone, no weights read)."""
    from ..fetch import FetchError

    path = Path(spec)
    if spec in PRESETS and not path.exists():
        return ModelConfig.from_name(spec)
    if path.is_file() and path.suffix == ".json":
        return ModelConfig.load(path)
    if not path.exists() and spec not in MODELS and not spec.startswith("hf:"):
        raise unknown_spec(spec, (*PRESETS, *MODELS), f"a preset ({', '.join(PRESETS)}), a config .json file, "
                           f"or {SPEC_FORMS}")
    try:
        return read_config(spec)
    except FetchError as e:
        raise UserError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    if args.context is not None and args.context < 1:
        raise UserError(f"--context must be at least 1, got {args.context}")
    cfg = resolve_config(args.model)
    if args.context is not None and args.context > cfg.context:
        raise UserError(f"--context {args.context:,} exceeds {cfg.name}'s context of {cfg.context:,} (the longest "
                        "sequence its positions support)")
    r = report(cfg, args.context)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    f, e, d2 = r["formula"], r["exact"], r["formula_in_d2"]
    fl = r["flops_per_token"]
    print(f"{cfg.name}: d_model={cfg.d_model}  n_layers={cfg.n_layers}  heads={cfg.n_heads}/{cfg.kv_heads} kv")
    print(f"{'per block':<22}{'formula':>16}{'':>10}")
    print(f"{'  attention':<22}{f['attention']:>16,}{d2['attention']:>8.2f}d^2")
    print(f"{'  mlp':<22}{f['mlp']:>16,}{d2['mlp']:>8.2f}d^2")
    exact_block = f"exact (with biases, norms) {r['exact_per_block']:,}"
    print(f"{'  block':<22}{f['block']:>16,}{d2['block']:>8.2f}d^2   {exact_block}")
    print(f"{'non-embedding':<22}{f['non_embedding']:>16,}   exact {e['non_embedding']:,}")
    print("exact tensors:")
    for k in ("embedding", "positions", "attention", "mlp", "norms", "unembedding"):
        print(f"  {k:<20}{e[k]:>16,}")
    print(f"  {'total':<20}{e['total']:>16,}   ({e['total'] / 1e6:.1f}M)")
    if e["active"] != e["total"]:  # a mixture of experts: what one token uses
        print(f"  {'active per token':<20}{e['active']:>16,}   ({e['active'] / 1e6:.1f}M: {cfg.experts_per_token} of "
              f"{cfg.n_experts} experts)")
    print(f"forward FLOPs/token at L={fl['context']}: {fl['total']:.3e} "
          f"(2 x {e['matmul']:,} matmul weights + attention core {fl['attention_core']:.3e},"
          f" {r['attention_core_share']:.0%} of 2 x non-embedding)")
    print(f"training FLOPs/token (~3x forward): {r['training_flops_per_token']:.3e}")
    return 0
