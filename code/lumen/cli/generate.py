"""`lumen generate MODEL --prompt TEXT`: continue a prompt with KV-cache decoding, streamed to stdout.

It samples by default (temperature 0.8, top-p 0.95, or the model's own generation_config.json) and says
the seed on stderr, so that a run can be repeated with --seed; --greedy (or --temperature 0) takes the
most likely token every time. Past the model's context the window slides (`GPT.stream`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import secrets
import sys
from pathlib import Path
from typing import Any

import torch

from ..files import read_json
from ..model import check_sampling, check_tokens
from ..packing import packed
from ..threads import tuned
from . import UserError
from .models import DTYPES, add_model_argument, checkpoint_note, load_model

# what generate samples with unless the model's files or the command line say otherwise: the settings the
# training samples use, with the unlikely tail cut off (greedy decoding makes these small models loop)
DEFAULTS: dict[str, Any] = {"temperature": 0.8, "top_p": 0.95, "top_k": None}
GENERATION_CONFIG = "generation_config.json"  # a Hugging Face directory's sampling defaults
MAX_SEED = 2**63 - 1
MAX_NEW_TOKENS = 2**20  # the most tokens one `lumen generate` writes (see run)


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="continue a prompt with a model (streams the continuation)")
    add_model_argument(p)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="how many tokens to add (default 64; past the model's context the window slides)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default 0.8, or the model's generation_config.json); 0 is greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample only from the smallest set of tokens with this probability mass (default 0.95)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (= --temperature 0)")
    p.add_argument("--seed", metavar="N", default=None,
                   help="random seed for sampling (default: a fresh one, printed on stderr to repeat the run)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weights' precision (default float32)")
    p.add_argument("--weights", choices=("float", "gguf"), default="float",
                   help="gguf: decode from a GGUF's own Q4_1/Q8_0 blocks as llama.cpp does (x rounded to 8 bits per "
                        "block; less memory; fastest with --compile); float (default): the weights dequantized, "
                        "the file's exact numbers")
    p.add_argument("--compile", action="store_true",
                   help="compile the decoding step with torch.compile: several times faster per token on CPU, "
                        "after a one-time compile (about a minute; cached after) (needs a C++ compiler)")
    return p


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS:,} (the most one run writes: hours "
                        f"of decoding on a CPU; continue from its output for more), got {args.max_new_tokens:,}")
    settings, source = sampling_settings(args)
    seed = parse_seed(args.seed) if args.seed is not None else secrets.randbelow(10**6)
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
    idx = torch.tensor([ids])
    check_tokens(idx, loaded.model.cfg, 0)
    note = checkpoint_note(args.model)
    if note:
        print(f"lumen generate: {note}", file=sys.stderr)
    print(f"lumen generate: {describe(settings, source, seed)}", file=sys.stderr)
    if args.compile:
        print("lumen generate: compiling the decoding step (about a minute on two cores)...", file=sys.stderr)
    steps = tuned(loaded.model.stream(  # threads measured as tokens come (lumen.threads: busy machines)
        idx, args.max_new_tokens, **settings, generator=torch.Generator().manual_seed(seed), compile=args.compile,
    ))
    recent: collections.deque[int] = collections.deque(maxlen=loaded.model.cfg.context)  # what a diagnosis reads
    greedy_check = settings["temperature"] == 0 and not args.compile
    try:
        with contextlib.nullcontext() if args.compile else packed(loaded.model), \
                finite_logits(loaded.model) if greedy_check else contextlib.nullcontext():  # eager: oneDNN's layout
            stream_text(kept(steps, recent), tok, sys.stdout)
    except (NonFiniteLogits, RuntimeError) as e:
        # sampling: torch.multinomial refuses probabilities that are not finite (its own check: nothing added to
        # a step); greedy: finite_logits. Then, once, where the forward pass went non-finite (lumen.inspect.finite)
        if not isinstance(e, NonFiniteLogits) and "probability tensor contains" not in str(e):
            raise
        from ..inspect.finite import non_finite_error

        seq = torch.tensor([(ids + list(recent))[-loaded.model.cfg.context:]])
        raise non_finite_error(loaded.model, seq, args.model) from None
    return 0


class NonFiniteLogits(Exception):
    """The last position's logits held NaN or infinity (see finite_logits)."""


@contextlib.contextmanager
def finite_logits(model):
    """While decoding greedily: the last position's logits are checked as the unembedding makes them (argmax would
    pick a NaN without complaint); a vocabulary-long check per token, next to a forward pass through every block."""
    def check(module, args, out):
        if not bool(torch.isfinite(out[:, -1]).all()):
            raise NonFiniteLogits()

    handle = model.lm_head.register_forward_hook(check)
    try:
        yield
    finally:
        handle.remove()


def kept(steps, recent: collections.deque):
    """The decoding steps, unchanged, with the latest token ids kept in `recent` (bounded)."""
    for nxt in steps:
        recent.append(int(nxt[0]))
        yield nxt


def sampling_settings(args: argparse.Namespace) -> tuple[dict, str]:
    """temperature, top_p, top_k: the command line over the model's generation_config.json over DEFAULTS,
    checked before anything is loaded; and where the defaults came from."""
    settings, source = dict(DEFAULTS), "lumen's defaults"
    path = Path(args.model) / GENERATION_CONFIG
    if path.is_file() and (from_file := read_generation_config(path)):
        settings.update(from_file)
        source = f"defaults from {path}"
    settings.update({k: getattr(args, k) for k in DEFAULTS if getattr(args, k) is not None})
    if args.greedy:
        if args.temperature not in (None, 0):
            raise UserError(f"--greedy and --temperature {args.temperature} contradict each other (give one)")
        settings["temperature"] = 0.0
    check_sampling(**settings)
    return settings, source


def read_generation_config(path: Path) -> dict:
    """The sampling defaults a Hugging Face generation_config.json carries (do_sample false: greedy)."""
    config = read_json(path, "generation config", UserError, "fix or remove it")
    found = {k: config[k] for k in ("temperature", "top_p", "top_k") if config.get(k) is not None}
    if found.get("top_k") == 0:  # Hugging Face's "no top-k"
        found["top_k"] = None
    if config.get("do_sample") is False:
        found["temperature"] = 0.0
    try:
        check_sampling(**{**DEFAULTS, **found})
    except UserError as e:
        raise UserError(f"{path}: {e} (fix the file, or give --temperature/--top-p/--top-k)") from None
    return found


def parse_seed(text: str) -> int:
    """--seed as a whole number torch's generator takes: 0 .. 2**63 - 1."""
    try:
        seed = int(text)
    except ValueError:
        raise UserError(f"--seed must be a whole number, got {text!r}") from None
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be between 0 and 2**63 - 1 ({MAX_SEED}), got {text}")
    return seed


def describe(settings: dict, source: str, seed: int) -> str:
    """One line on stderr: how the tokens are chosen, and the seed that repeats them."""
    if settings["temperature"] == 0:
        return "greedy decoding"
    parts = [f"temperature {settings['temperature']:g}"]
    if settings["top_p"] is not None:
        parts.append(f"top-p {settings['top_p']:g}")
    if settings["top_k"] is not None:
        parts.append(f"top-k {settings['top_k']}")
    return (f"sampling at {', '.join(parts)} ({source}), seed {seed}: --seed {seed} repeats it, "
            "--greedy takes the most likely token")


def stream_text(steps, tok, out) -> int:
    """Print each new piece of text as its tokens arrive; stop at the end-of-sequence token; return how many
    tokens were printed.

    A character may span several byte-level tokens, and a decoder may treat a token at the start of the text
    differently (a leading space dropped), so the tokens not yet printed are decoded after the last few printed
    ones, and only what they add (not ending in a half character) is written. Memory and time per token stay
    the same however long the output: nothing but that short tail is kept."""
    tail: list[int] = []      # the last tokens printed: context for decoding the next ones
    pending: list[int] = []   # tokens not yet printed
    n = 0
    for nxt in steps:
        token = int(nxt[0])
        if token == tok.eos_id:
            break
        pending.append(token)
        n += 1
        before = tok.decode(tail)
        text = tok.decode(tail + pending)
        if (not text.endswith("\ufffd") and text.startswith(before)) or len(pending) >= HELD_TOKENS:
            out.write(text[len(before):] if text.startswith(before) else tok.decode(pending))
            out.flush()
            tail, pending = (tail + pending)[-TAIL_TOKENS:], []
    before = tok.decode(tail)
    text = tok.decode(tail + pending)
    out.write((text[len(before):] if text.startswith(before) else tok.decode(pending)) + "\n")
    out.flush()
    return n


TAIL_TOKENS = 8    # printed tokens kept as context for decoding the next
HELD_TOKENS = 64   # tokens held back (a character still incomplete) before they are printed anyway
