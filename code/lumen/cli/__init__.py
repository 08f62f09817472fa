"""The `lumen` command: one module per subcommand, each with `add_parser(sub)` and `run(args)`.

Subcommands parse arguments, call the library, and print; they hold no logic of their own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import NoReturn

from ..errors import LumenError, UserError

# subcommand name -> module under lumen.cli that implements it
COMMANDS = {
    "count": "count",
    "lens": "lens",
    "tuned-lens": "tuned_lens",
    "delete-layer": "delete_layer",
    "neurons": "neurons",
    "heads": "heads",
    "train": "train",
    "generate": "generate",
    "eval": "eval",
    "convert": "convert",
    "fetch": "fetch",
    "experiment": "experiment",
    "attribute": "attribute",
    "patch": "patch",
    "explore": "explore",
    "serve": "serve",
    "practice": "practice",
    "features": "features",
    "verify": "verify",
}


__all__ = ["COMMANDS", "UserError", "build_parser", "main"]

REPORT = "this is a bug in lumen, not in your input: please report it with the command you ran and the traceback above"


DESCRIPTION = """\
lumen: a transformer language model you can read, train, load real weights into, and look inside.

A MODEL is the same everywhere: smollm2 (SmolLM2-135M, fetched once), a preset name (gpt2, baby-llama, ...;
count only), a .gguf file, a Hugging Face directory, or a lumen run or checkpoint directory."""

EPILOG = """\
examples:
  lumen train                                          train the default Shakespeare model (~5 min on 2 cores)
  lumen generate runs/shakespeare --prompt "ROMEO:"    continue a prompt with the model you trained
  lumen lens smollm2 --prompt "The capital of France is" --out out/lens
  lumen count smollm2                                  parameters and FLOPs, formula beside exact

`lumen COMMAND --help` lists a command's options and their defaults."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default after its help (unless the help gives it)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 30, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, width)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.option_strings and not any(action.default is v for v in (None, False, argparse.SUPPRESS))
        if shown and "default" not in text and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage error as one line, like lumen's own errors (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _leaves(parser: argparse.ArgumentParser):
    """The parser and every (sub-)subparser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in dict.fromkeys(action.choices.values()):
                yield from _leaves(p)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = Parser(prog="lumen", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"lumen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"lumen.cli.{module}")
        p = mod.add_parser(sub, name)
        p.set_defaults(run=mod.run)
    for p in _leaves(parser):
        p.formatter_class = HelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..progress import quiet

    args = build_parser().parse_args(argv)
    try:
        with quiet(getattr(args, "quiet", False)):
            return int(args.run(args) or 0)
    except LumenError as e:  # what the user gave is wrong: one line, what and where and what to do
        if os.environ.get("LUMEN_DEBUG"):
            raise
        print(f"lumen {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lumen {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped early (`lumen ... | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python flushes stdout on exit)
        return 141
    except Exception:  # anything else is lumen's own bug: show it whole
        traceback.print_exc()
        print(f"lumen {args.command}: internal error: {REPORT}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
