"""`lumen practice list|start|check|hint|solution`: the chapter's exercises, checked against lumen's own code.

  lumen practice list                      the exercises in the chapter's order, with their sections
  lumen practice start NAME [DIR]          write DIR/NAME.py: the task, the signature, the docstring
  lumen practice check NAME [FILE]         run the checks on your file (exit 0 only when all pass)
  lumen practice hint NAME                 what to write, and the mistakes people make
  lumen practice solution NAME             lumen's own code for it, by file and line

`check` runs your code in a process of its own, at most --timeout seconds per check (60) and --memory GiB (4):
ending that process, running past the time or patching what the checks use fails the check; it never passes.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from ..errors import UserError


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="the chapter's exercises: start one, check your file, get a hint, see lumen's code",
                       description=__doc__)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="the exercises, in the chapter's order")
    start = actions.add_parser("start", help="write the starting file of an exercise")
    start.add_argument("name", metavar="NAME")
    start.add_argument("dir", metavar="DIR", nargs="?", default=".", help="where to write NAME.py")
    check = actions.add_parser("check", help="check your file (exit 0 when every check passes, 1 when one fails)")
    check.add_argument("name", metavar="NAME")
    check.add_argument("file", metavar="FILE", nargs="?", help="your file (default: NAME.py here)")
    check.add_argument("--seed", type=int, default=0, help="the random inputs' seed")
    check.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                       help="how long your code may run in one check (default 60)")
    check.add_argument("--memory", type=float, default=4.0, metavar="GIB",
                       help="how much memory your code may use, in GiB (default 4)")
    hint = actions.add_parser("hint", help="what to write, and the mistakes people make")
    hint.add_argument("name", metavar="NAME")
    solution = actions.add_parser("solution", help="lumen's own code for an exercise, by file and line")
    solution.add_argument("name", metavar="NAME")
    return p


def run(args: argparse.Namespace) -> int:
    from .. import practice

    if args.action == "list":
        section = None
        for i, e in enumerate(practice.EXERCISES.values(), 1):
            if e.section != section:
                section = e.section
                print(f"\n{section}")
            smollm2 = "  (loads SmolLM2)" if e.reads_smollm2 else ""
            print(f"  {i:>2}. {e.name:<13} {e.title}{smollm2}")
        print("\nStart one with `lumen practice start NAME`, then `lumen practice check NAME`.")
        return 0
    ex = practice.exercise(args.name)
    if args.action == "start":
        return _start(ex, Path(args.dir))
    if args.action == "hint":
        print(f"{ex.name}: {_wrap(ex.hints['task'], 2)[2:]}")
        mistakes = [(k, v) for k, v in ex.hints.items() if k != "task"]
        if mistakes:
            print("\nMistakes people make (`lumen practice check` names the one it sees):")
            for _, text in mistakes:
                print(_wrap("- " + text, 2, first=0))
        return 0
    if args.action == "solution":
        for loc in practice.solutions(ex.name):
            print(f"# {loc.name}: {loc}\n{textwrap.dedent(loc.source())}\n")
        return 0
    for flag, value in (("--timeout", args.timeout), ("--memory", args.memory)):
        if not value > 0 or value == float("inf"):
            raise UserError(f"{flag} {value:g}: give a number above 0")
    return _check(practice, ex, Path(args.file) if args.file else Path(ex.file_name), args)


def _start(ex, folder: Path) -> int:
    from ..files import write_text

    path = folder / ex.file_name
    if path.exists():
        raise UserError(f"{path} already exists: check it with `lumen practice check {ex.name} {path}`, or move it "
                        "away to start again")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a folder (give a folder to write {ex.file_name} into)")
    write_text(path, ex.starting_file())
    print(f"wrote {path}: {ex.title}")
    print(f"when it is written: lumen practice check {ex.name} {path}")
    return 0


MARKS = {"passed": "ok     ", "failed": "FAILED ", "skipped": "skipped"}


def _check(practice, ex, path: Path, args: argparse.Namespace) -> int:
    """Your code runs in a process of its own (lumen.practice.apart); the verdict is made here."""
    report = practice.check_file(ex.name, path, args.seed, timeout=args.timeout, memory=args.memory)
    print(f"{ex.name} ({ex.section}): {path}")
    for o in report.outcomes:
        print(f"  {MARKS[o.status]} {o.check}")
        if o.status == "failed":
            print(_wrap(f"seen: {o.seen}", 10))
            print(_wrap(f"hint: {ex.hint(o.hint)}", 10))
        elif o.status == "skipped":
            print(_wrap(f"({o.seen})", 10))
    for note in report.notes:
        print(_wrap(f"note: {note}", 2, first=0))
    n = {s: sum(o.status == s for o in report.outcomes) for s in MARKS}
    if report.passed:
        checks = f"{n['passed']} check{'s' if n['passed'] > 1 else ''}"
        print(f"all {checks} passed. lumen's own: `lumen practice solution {ex.name}`")
        return 0
    print(f"{n['failed']} failed, {n['passed']} passed, {n['skipped']} skipped.")
    return 1


def _wrap(text: str, indent: int, first: int | None = None) -> str:
    lead = " " * (indent if first is None else first)
    return textwrap.fill(text, 110, initial_indent=lead, subsequent_indent=" " * indent)
