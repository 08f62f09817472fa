"""`lumen generate MODEL --prompt TEXT`: continue a prompt with KV-cache decoding, streamed to stdout."""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from ..packing import packed
from ..threads import tuned
from . import UserError
from .models import DTYPES, add_model_argument, load_model


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="continue a prompt with a model (streams the continuation)")
    add_model_argument(p)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64, help="how many tokens to add (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default); 1 samples as trained")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample only from the smallest set with this mass")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' precision (default float32)")
    p.add_argument("--weights", choices=("float", "gguf"), default="float",
                   help="gguf: decode from a GGUF's own Q4_1/Q8_0 blocks (less memory; fastest with --compile); "
                        "float (default): the weights dequantized")
    p.add_argument("--compile", action="store_true",
                   help="compile the decoding step with torch.compile: ~3x faster per token on CPU (SmolLM2), "
                        "after ~1 minute of compiling the first time, ~10 s once cached (needs a C++ compiler)")
    return p


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {args.top_k}")
    loaded = load_model(args.model, args.dtype, args.weights)
    tok = loaded.tokenizer
    if tok is None:
        raise UserError(f"{args.model} has no tokenizer to read a text prompt (save one with the model)")
    prompt = args.prompt
    if args.chat:
        from ..formats import chat_prompt

        prompt = chat_prompt(tok, prompt)
    ids = tok.encode(prompt)
    if not ids:
        raise UserError("the prompt is empty after tokenization (give some text with --prompt)")
    generator = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    if args.compile:
        print("lumen generate: compiling the decoding step (about a minute on two cores)...", file=sys.stderr)
    steps = tuned(loaded.model.stream(  # threads measured as tokens come (lumen.threads: busy machines)
        torch.tensor([ids]), args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, generator=generator, compile=args.compile,
    ))
    with contextlib.nullcontext() if args.compile else packed(loaded.model):  # eager: oneDNN's layout
        stream_text(steps, tok, sys.stdout)
    return 0


def stream_text(steps, tok, out) -> list[int]:
    """Print each new piece of text as its tokens arrive; stop at the end-of-sequence token.

    A character may span several byte-level tokens, so text is decoded from all new ids and only
    the part past what was printed (and not ending in a half character) is written."""
    new: list[int] = []
    shown = ""
    for nxt in steps:
        token = int(nxt[0])
        if token == tok.eos_id:
            break
        new.append(token)
        text = tok.decode(new)
        if not text.endswith("\ufffd") and text.startswith(shown):
            out.write(text[len(shown):])
            out.flush()
            shown = text
    text = tok.decode(new)
    out.write(text[len(shown):] + "\n")
    out.flush()
    return new
