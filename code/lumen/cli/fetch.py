"""`lumen fetch NAME`: download a named artifact (a model, a corpus) into lumen's cache once, checked by sha256."""

from __future__ import annotations

import argparse

from . import UserError


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    from ..fetch import ARTIFACTS

    p = sub.add_parser(name, help="download a model or corpus into the cache (once; verified by sha256)")
    p.add_argument("name", help=f"one of: {', '.join(ARTIFACTS)}")
    return p


def run(args: argparse.Namespace) -> int:
    from ..fetch import FetchError, fetch

    try:
        path = fetch(args.name)
    except FetchError as e:
        raise UserError(str(e)) from None
    print(path)
    return 0
