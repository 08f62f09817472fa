"""`lumen serve MODEL [--port N] [--prompt P] [--tuned PATH]`: the explorer page on http://127.0.0.1:PORT/
(this machine only), with a text box to explore new prompts; the model is loaded once. Ctrl-C stops it."""

from __future__ import annotations

import argparse
import math

from . import UserError
from .models import add_model_argument, load_with_tokenizer


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="serve the explorer page on 127.0.0.1, with a box for new prompts")
    add_model_argument(p)
    p.add_argument("--port", type=int, default=0, help="the port (default 0: a free one, printed)")
    p.add_argument("--prompt", help="the first page's prompt (default: 'The Eiffel Tower is in the city of' when the "
                   "model's tokenizer can encode it, else the form alone)")
    p.add_argument("--tuned", metavar="PATH", help="a tuned lens for this model: adds a lens toggle")
    p.add_argument("--head-timeout", type=float, metavar="SECONDS",
                   help="the time a client has to send its whole request head (default 10): a slow or silent client "
                   "is dropped then")
    p.add_argument("--verbose", action="store_true", help="log every request")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.tuned_lens import TunedLens
    from ..report.serve import HEAD_SECONDS, first_prompt, make_server

    if not 0 <= args.port < 65536:
        raise UserError(f"--port must be in 0..65535, got {args.port}")
    head_seconds = HEAD_SECONDS if args.head_timeout is None else args.head_timeout
    if not (math.isfinite(head_seconds) and 0 < head_seconds <= 3600):
        raise UserError(f"--head-timeout must be a number of seconds in (0, 3600], got {args.head_timeout}")
    model, tok = load_with_tokenizer(args.model)
    tuned = TunedLens.load(args.tuned, model) if args.tuned else None
    prompt = first_prompt(model, tok, args.prompt)
    try:
        server = make_server(model, tok, args.port, tuned, prompt, quiet=not args.verbose,
                             head_seconds=head_seconds)
    except OSError as e:
        raise UserError(f"cannot listen on 127.0.0.1:{args.port} ({e.strerror}): choose another --port") from None
    print(f"lumen serve: {model.cfg.name} at {server.url}  (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
