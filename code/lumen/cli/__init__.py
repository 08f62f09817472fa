"""The `lumen` command: one module per subcommand, each with `add_parser(sub)` and `run(args)`.

Subcommands parse arguments, call the library, and print; they hold no logic of their own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

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
}


__all__ = ["COMMANDS", "UserError", "build_parser", "main"]

REPORT = "this is a bug in lumen, not in your input: please report it with the command you ran and the traceback above"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lumen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"lumen.cli.{module}")
        p = mod.add_parser(sub, name)
        p.set_defaults(run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except LumenError as e:  # what the user gave is wrong: one line, what and where and what to do
        if os.environ.get("LUMEN_DEBUG"):
            raise
        print(f"lumen {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lumen {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:  # anything else is lumen's own bug: show it whole
        traceback.print_exc()
        print(f"lumen {args.command}: internal error: {REPORT}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
