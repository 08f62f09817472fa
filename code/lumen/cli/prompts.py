"""The command-line side of `--prompts FILE` (lens, attribute, patch): the options and their help. The file
format itself is lumen.prompts; what each command computes over it is lumen.inspect.datasets."""

from __future__ import annotations

import argparse

from ..errors import UserError
from ..prompts import BATCH_SIZE
from .models import input_file, path_text

PROMPTS_HELP = ("a file of prompts: one per line, or JSON lines {\"prompt\": ..., \"answer\": \" Mary\", "
                "\"wrong\": \" John\"} (answer and wrong optional); each prompt is reported, then the average")
PAIRS_HELP = ("a JSON-lines file of prompt pairs, one object a line: {\"clean\": ..., \"corrupt\": ..., "
              "\"answer\": \" Mary\", \"wrong\": \" John\"} (answer and wrong optional: by default each prompt's "
              "own prediction); each pair is reported, then the average")


def add_prompts_arguments(p: argparse.ArgumentParser, group: argparse._MutuallyExclusiveGroup | None = None,
                          pairs: bool = False) -> None:
    """--prompts FILE (in `group`, beside the options that give one prompt) and --batch-size N."""
    (group or p).add_argument("--prompts", metavar="FILE", type=path_text, help=PAIRS_HELP if pairs else PROMPTS_HELP)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=BATCH_SIZE, metavar="N",
                   help="with --prompts: prompts run side by side in one padded batch (memory grows with it)"
                   + ("; each pair's patched copies then run in batches of their own" if pairs else ""))


def check_prompts_file(args: argparse.Namespace) -> None:
    """--prompts FILE checked before the model loads: a wrong path is named at once, not after the load."""
    if args.prompts:
        input_file(args.prompts, "--prompts", "prompt file")


def refuse_with_prompts(option: str, given: bool) -> None:
    """An option that reads one prompt, given beside --prompts: one line saying so."""
    if given:
        raise UserError(f"{option} reads one prompt, not a --prompts file: leave it out")
