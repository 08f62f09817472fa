"""`lumen generate MODEL --prompt TEXT`: continue a prompt with KV-cache decoding, streamed to stdout.

It samples by default (temperature 0.8, top-p 0.95, or the model's own generation_config.json: lumen.decode)
and says the seed on stderr, so that a run can be repeated with --seed; --greedy (or --temperature 0) takes
the most likely token every time. Past the model's context the window slides. Decoding goes through the
speed wing's door (lumen.fast.decoding), as a Python caller's can.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..decode import Sampling, sampling_for
from ..model import check_tokens
from . import UserError
from .models import DTYPES, add_model_argument, checkpoint_note, load_model

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
                        "block; less memory; fastest with --aot); float (default): the weights dequantized, "
                        "the file's exact numbers")
    p.add_argument("--compile", action="store_true",
                   help="compile the decoding step with torch.compile, after a one-time compile (about a minute; "
                        "cached after; needs a C++ compiler): faster per token on many CPUs, not all; the run ends "
                        "by timing a few eager steps and saying which path was faster on this machine")
    p.add_argument("--aot", action="store_true",
                   help="instead of --compile: the one-token step compiled ahead of time by AOTInductor, once per "
                        "model shape (a few minutes; needs a C++ compiler), then only loaded: no compiler in later "
                        "runs, less memory, the fastest decoding")
    return p


def run(args: argparse.Namespace) -> int:
    from ..fast import decoding

    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens must be between 1 and {MAX_NEW_TOKENS:,} (the most one run writes: hours "
                        f"of decoding on a CPU; continue from its output for more), got {args.max_new_tokens:,}")
    changes = sampling_changes(args)
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
    sampling = sampling_for(loaded.model, **changes)
    source = "the model's generation_config.json" if loaded.model.sampling is not None else "lumen's defaults"
    print(f"lumen generate: {describe(sampling, source, seed)}", file=sys.stderr)
    if args.compile and args.aot:
        raise UserError("--compile and --aot are two ways to compile the decoding step: give one of them")
    compile = "aot" if args.aot else args.compile
    if compile:   # a bar cannot know how long a compiler runs: a line before, and one when it is done
        print("lumen generate: " + ("compiling the decoding step ahead of time (a few minutes the first time for "
                                    "this model's shape, then only loaded)..." if args.aot else
                                    "compiling the decoding step (about a minute on two cores the first time)..."),
              file=sys.stderr)
    generator = torch.Generator().manual_seed(seed)
    recent: collections.deque[int] = collections.deque(maxlen=loaded.model.cfg.context)  # what a diagnosis reads
    try:
        # the speed wing (compiled or packed, threads tuned); greedy eager steps check their logits (finite_logits)
        with decoding(loaded.model, compile) as decoder, \
                finite_logits(loaded.model) if sampling.greedy and not compile else contextlib.nullcontext(), \
                contextlib.closing(decoder.tokens(idx, args.max_new_tokens, sampling, generator)) as steps:
            timing = print_tokens(kept(steps, recent), tok, sys.stdout, compiled if compile else None)
    except (NonFiniteLogits, RuntimeError) as e:
        # sampling: torch.multinomial refuses probabilities that are not finite (its own check: nothing added to
        # a step); greedy: finite_logits. Then, once, where the forward pass went non-finite (lumen.inspect.finite)
        if not isinstance(e, NonFiniteLogits) and "probability tensor contains" not in str(e):
            raise
        from ..inspect.finite import non_finite_error

        seq = torch.tensor([(ids + list(recent))[-loaded.model.cfg.context:]])
        raise non_finite_error(loaded.model, seq, args.model) from None
    print(f"lumen generate: {timing.describe(bool(compile))}", file=sys.stderr)
    if compile and timing.steady_rate() is not None:
        # the path not taken, measured on a few steps at the same context length (seconds, not a benchmark)
        seq = torch.tensor([(ids + list(recent))[-(loaded.model.cfg.context - EAGER_STEPS - 1):]])
        print(f"lumen generate: {compared(timing, eager_rate(loaded.model, seq), args.aot)}", file=sys.stderr)
    return 0


WARMUP_STEPS = 2   # steps after the first token left out of the steady rate: a compiled step compiles (and may
                   # compile again for the second step's shapes) and the thread count is being tuned in them
EAGER_STEPS = 4    # eager steps timed after --compile, to say which path is faster on this machine


@dataclass
class Timing:
    """When the tokens of one run came: the prompt's pass with the first token, the WARMUP_STEPS steps after
    it, and the steady steps after those (the rate a long generation runs at)."""

    tokens: int = 0
    prompt_s: float = 0.0    # the prompt's forward pass and the first token
    warmup_s: float = 0.0    # the warm-up steps (compiling happens here and in the prompt's pass)
    steady_s: float = 0.0    # every later step

    def steady_steps(self) -> int:
        return max(0, self.tokens - 1 - WARMUP_STEPS)

    def steady_rate(self) -> float | None:
        """Tokens per second over the steady steps; None when there were none (or no measurable time)."""
        return self.steady_steps() / self.steady_s if self.steady_steps() and self.steady_s > 0 else None

    def describe(self, compiled: bool) -> str:
        """One line: how long the prompt and warm-up took (with --compile: about how long compiling took), and
        the steady decoding rate."""
        first = f"{self.tokens} tokens: the prompt and first token {self.prompt_s:.2f} s"
        warm = min(WARMUP_STEPS, max(0, self.tokens - 1))
        if warm:
            first += f", the next {warm} step{'s' * (warm > 1)} {self.warmup_s:.2f} s"
        rate = self.steady_rate()
        if rate is None:
            return first + " (too few tokens for a steady rate: give more --max-new-tokens)"
        if compiled:   # compiling = the time before the steady steps, less what its 1 + warm steps take at the rate
            compiling = max(0.0, self.prompt_s + self.warmup_s - (1 + warm) / rate)
            first += f" (compiling included: about {compiling:.0f} s)"
        return first + f", then {self.steady_steps()} steps at {rate:.1f} tokens/s"


def eager_rate(model, seq: torch.Tensor, steps: int = EAGER_STEPS) -> float:
    """The eager path's tokens per second (no compiling) for `model` after the context `seq` (1, T): the median
    of `steps` greedy steps' times, after the prompt's pass and one step of warm-up, at torch's thread count
    (the thread tuner left out: its trials of other counts are slow steps on purpose)."""
    from ..decode import tokens as plain_tokens
    from ..fast import decoding

    with decoding(model, False) as decoder, torch.no_grad():
        tokens = plain_tokens(model, seq, steps + 2, Sampling(temperature=0.0), step=decoder.step)   # (run out)
        next(tokens)
        next(tokens)
        times = []
        start = time.perf_counter()
        for _ in tokens:
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
        return 1 / statistics.median(times)


def compared(timing: Timing, eager: float, aot: bool) -> str:
    """One line: the compiled path's steady rate beside the eager path's, and which to use on this machine."""
    flag = "--aot" if aot else "--compile"
    rate = timing.steady_rate() or 0.0
    both = (f"{flag} decoded {rate:.1f} tokens/s, the eager path (no {flag}) {eager:.1f} tokens/s "
            f"(the median of {EAGER_STEPS} steps timed just now)")
    if eager > rate:
        return f"{flag} is slower than the eager path on this machine: {both}; leave out {flag}"
    return f"{flag} is faster than the eager path on this machine: {both}"


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


def sampling_changes(args: argparse.Namespace) -> dict:
    """temperature, top_p, top_k as given on the command line (the rest come from the model's files or
    lumen's defaults), checked before anything is loaded."""
    changes = {k: getattr(args, k) for k in ("temperature", "top_p", "top_k")}
    if args.greedy:
        if args.temperature not in (None, 0):
            raise UserError(f"--greedy and --temperature {args.temperature} contradict each other (give one)")
        changes["temperature"] = 0.0
    Sampling().but(**changes)  # a clear error now for a setting that cannot work
    return changes


def parse_seed(text: str) -> int:
    """--seed as a whole number torch's generator takes: 0 .. 2**63 - 1."""
    try:
        seed = int(text)
    except ValueError:
        raise UserError(f"--seed must be a whole number, got {text!r}") from None
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be between 0 and 2**63 - 1 ({MAX_SEED}), got {text}")
    return seed


def describe(sampling: Sampling, source: str, seed: int) -> str:
    """One line on stderr: how the tokens are chosen, and the seed that repeats them."""
    if sampling.greedy:
        return "greedy decoding"
    return (f"{sampling.describe()} ({source}), seed {seed}: --seed {seed} repeats it, "
            "--greedy takes the most likely token")


def compiled(timing: Timing) -> None:
    """The line --compile prints when its warm-up is over, before the text: how long it took until then."""
    warm = min(WARMUP_STEPS, max(0, timing.tokens - 1))
    print(f"lumen generate: compiled: {timing.prompt_s + timing.warmup_s:.1f} s for the prompt's pass and "
          f"{warm} step{'s' * (warm != 1)}, compiling included (the text follows, at the compiled speed)",
          file=sys.stderr, flush=True)


def print_tokens(steps, tok, out, ready: Callable[[Timing], None] | None = None) -> Timing:
    """Print each new piece of text as its tokens arrive; stop at the end-of-sequence token; return how many
    tokens were printed and when they came (Timing: the prompt and first token, which hold any compiling, the
    warm-up steps, the steady steps).

    A character may span several byte-level tokens, and a decoder may treat a token at the start of the text
    differently (a leading space dropped), so the tokens not yet printed are decoded after the last few printed
    ones, and only what they add (not ending in a half character) is written. Memory and time per token stay
    the same however long the output: nothing but that short tail is kept.

    ready: called once when the warm-up is over (after the first token and WARMUP_STEPS steps, or at the end
    if there are fewer), before any text is written: --compile says there how long compiling took."""
    tail: list[int] = []      # the last tokens printed: context for decoding the next ones
    pending: list[int] = []   # tokens not yet printed
    timing = Timing()
    last = time.perf_counter()
    for nxt in steps:
        token = int(nxt[0])
        now = time.perf_counter()
        if token == tok.eos_id:
            break
        if timing.tokens == 0:
            timing.prompt_s = now - last
        elif timing.tokens <= WARMUP_STEPS:
            timing.warmup_s += now - last
        else:
            timing.steady_s += now - last
        last = now
        pending.append(token)
        timing.tokens += 1
        if ready is not None:
            if timing.tokens <= WARMUP_STEPS:
                continue   # held back until the warm-up is over
            ready(timing)
            ready = None
        before = tok.decode(tail)
        text = tok.decode(tail + pending)
        if (not text.endswith("\ufffd") and text.startswith(before)) or len(pending) >= HELD_TOKENS:
            out.write(text[len(before):] if text.startswith(before) else tok.decode(pending))
            out.flush()
            tail, pending = (tail + pending)[-TAIL_TOKENS:], []
    if ready is not None:
        ready(timing)
    before = tok.decode(tail)
    text = tok.decode(tail + pending)
    out.write((text[len(before):] if text.startswith(before) else tok.decode(pending)) + "\n")
    out.flush()
    return timing


TAIL_TOKENS = 8    # printed tokens kept as context for decoding the next
HELD_TOKENS = 64   # tokens held back (a character still incomplete) before they are printed anyway
