"""`lumen verify MODEL [--text FILE] [--dtype float32|bfloat16] [--steps N] [--json]`: a receipt that lumen computes
what Hugging Face transformers computes on the same weights, and for a GGUF file what llama.cpp computes
(lumen.formats.verify): exit 0 within the noise floor, 1 outside it, 2 for bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .eval import read_text
from .models import add_model_argument, at_least

EPILOG = """\
For a Hugging Face directory or hf:ORG/NAME, transformers reads the same directory; for a .gguf file (or smollm2),
transformers reads the same file (gguf_file=) and, when llama-cpp-python is installed, llama.cpp runs it too (its
noise floor goes by the file's matrix types). Needs transformers (and llama-cpp-python for llama.cpp):
pip install 'lumen-lm[verify]'."""


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="check lumen's logits against Hugging Face transformers' (and llama.cpp's) on the "
                       "same weights", description=__doc__.split(":", 1)[1].strip(), epilog=EPILOG)
    add_model_argument(p, "a Hugging Face directory, hf:ORG/NAME[@REVISION], a .gguf file or smollm2")
    p.add_argument("--text", type=Path, default=None, help="a UTF-8 text file to compare on, besides the built-in one")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="lumen's and transformers' precision (noise floor: 5e-5 relative in float32, 1e-2 in "
                   "bfloat16)")
    p.add_argument("--steps", type=int, default=32, help="greedy tokens each model continues every text with")
    p.add_argument("--json", action="store_true", help="print the receipt as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from ..formats.verify import FIXED_TEXT, LLAMA_CPP, TRANSFORMERS, verify

    at_least(args, "steps", least=0)
    texts = {"built-in text": FIXED_TEXT}
    if args.text is not None:
        texts[str(args.text)] = read_text(args.text)
    receipt = verify(args.model, texts, args.dtype, args.steps)
    if args.json:
        print(json.dumps(receipt.to_dict(), indent=2))
        return 0 if receipt.passed else 1
    against = sorted({c.against for c in receipt.comparisons}, key=[TRANSFORMERS, LLAMA_CPP].index)
    names = {TRANSFORMERS: f"transformers ({receipt.reference})", LLAMA_CPP: "llama.cpp (llama-cpp-python)"}
    print(f"lumen verify {args.model}: lumen against {' and '.join(names[a] for a in against)}, {receipt.dtype}")
    shown = ""
    for c in receipt.comparisons:
        if c.text != shown:
            part = f" (the first of {c.text_tokens}: the context less the steps)" if c.text_tokens > c.tokens else ""
            print(f"  {c.text}: {c.tokens} tokens{part}")
            shown = c.text
        indent = "    "
        if len(against) > 1:
            print(f"    against {c.against}")
            indent = "      "
        print(f"{indent}max |Δlogit|       {c.max_abs:.3e}")
        print(f"{indent}relative error     {c.relative:.3e}  (noise floor {c.threshold:.0e}: "
              f"{'within' if c.relative <= c.threshold else 'OUTSIDE'})")
        print(f"{indent}KL({c.against}‖lumen) {c.kl:.3e} nats per position (mean)")
        print(f"{indent}top-1 agreement    {c.top1:.1%}")
        same = c.greedy_lumen == c.greedy_reference
        print(f"{indent}greedy, {len(c.greedy_lumen)} steps: {'the same tokens' if same else 'DIFFERENT'}"
              f"{'' if same or c.greedy_must_agree else ' (reported only: not within float32 rounding)'}")
        print(f"{indent}  lumen        {c.greedy_lumen} {c.continuation!r}")
        if not same:
            print(f"{indent}  {c.against:<12} {c.greedy_reference}")
    for note in receipt.notes:
        print(f"  {note}")
    what = " and ".join(against)
    print(f"PASS: lumen computes what {what} compute{'s' if len(against) == 1 else ''}" if receipt.passed else
          f"FAIL: lumen and {what} disagree beyond the noise floor")
    return 0 if receipt.passed else 1
