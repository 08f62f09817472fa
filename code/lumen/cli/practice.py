"""`lumen practice list|start|check|hint|solution`: the chapter's exercises, checked against lumen's own code.

  lumen practice list                      the exercises in the chapter's order, with their sections
  lumen practice start NAME [DIR]          write DIR/NAME.py: the task, the signature, the docstring
  lumen practice check NAME [FILE]         run the checks on your file (exit 0 only when all pass)
  lumen practice hint NAME [FILE]          a hint for the mistake your last check saw, one step at a time
  lumen practice solution NAME             lumen's own code for it, by file and line

`check` runs your code in a process of its own, at most --timeout seconds per check (60) and --memory GiB (4):
ending that process, running past the time or patching what the checks use fails the check; it never passes.
It keeps its verdict in your file's folder (.lumen-practice.json), and `hint` answers that verdict in steps:
first what to look at, then the formula (`hint NAME --more`), then the fix (`--more` again). `--step N` shows
step N; the same mistake checked again keeps the steps you have seen, another one starts at step 1.
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
    hint = actions.add_parser("hint", help="a hint for the mistake your last check saw, one step at a time")
    hint.add_argument("name", metavar="NAME")
    hint.add_argument("file", metavar="FILE", nargs="?", help="the file you checked (default: NAME.py here)")
    more = hint.add_mutually_exclusive_group()
    more.add_argument("--more", action="store_true", help="the next step too (the formula, then the fix)")
    more.add_argument("--step", type=int, metavar="N", help="step N alone (1 what to look at, 2 the formula, "
                      "3 the fix)")
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
        return _hint(ex, Path(args.file) if args.file else Path(ex.file_name), args.more, args.step)
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
    from ..practice import verdict

    report = practice.check_file(ex.name, path, args.seed, timeout=args.timeout, memory=args.memory)
    verdict.save(report, path)
    print(f"{ex.name} ({ex.section}): {path}")
    for o in report.outcomes:
        print(f"  {MARKS[o.status]} {o.check}")
        if o.status == "failed":
            print(_wrap(f"seen: {o.seen}", 10))
        elif o.status == "skipped":
            print(_wrap(f"({o.seen})", 10))
    for note in report.notes:
        print(_wrap(f"note: {note}", 2, first=0))
    n = {s: sum(o.status == s for o in report.outcomes) for s in MARKS}
    if report.passed:
        checks = f"{n['passed']} check{'s' if n['passed'] > 1 else ''}"
        print(f"all {checks} passed. lumen's own: `lumen practice solution {ex.name}`")
        return 0
    print(f"a hint for the first failure, a step at a time: lumen practice hint {ex.name}{_file_arg(ex, path)}")
    print(f"{n['failed']} failed, {n['passed']} passed, {n['skipped']} skipped.")
    return 1


def _file_arg(ex, path: Path) -> str:
    """FILE as the hint command needs it: nothing when it is NAME.py here, the default."""
    return "" if path == Path(ex.file_name) else f" {path}"


def _hint(ex, path: Path, more: bool, step: int | None) -> int:
    """The hint for the mistake the last check of `path` saw: the steps shown so far (at least the first),
    one more with --more, or step N alone with --step N."""
    from ..practice import verdict

    last = verdict.read(path.parent, ex.name)
    if last is None or Path(last.file).name != path.name:
        print(f"{ex.name}: {_wrap(str(ex.hints['task']), 2)[2:]}")
        print(f"\nNo check of {path} yet: `lumen practice check {ex.name}{_file_arg(ex, path)}` checks it, and then "
              "this hint answers the mistake it saw, a step at a time.")
        return 0
    if last.passed:
        print(f"{ex.name}: your last check of {path} passed. lumen's own: `lumen practice solution {ex.name}`")
        return 0
    steps = ex.steps(last.check, last.seen, last.hint)
    if step is not None and not 1 <= step <= len(steps):
        raise UserError(f"--step {step}: this hint has steps 1 to {len(steps)}")
    reached = min(len(steps), max(1, last.shown) + (1 if more and last.shown else 0))
    show = [step] if step is not None else list(range(1, reached + 1))
    last.shown = max(last.shown, reached if step is None else step)
    verdict.shown(path.parent, ex.name, last)
    print(f"{ex.name}: the check \"{last.check}\" failed")
    for k in show:
        title, text = steps[k - 1]
        print(_wrap(f"step {k} of {len(steps)}, {title}: {text}", 2, first=0))
    after = max(show)
    if after < len(steps):
        flag = "--more" if step is None else f"--step {after + 1}"
        print(f"next, step {after + 1} ({steps[after][0]}): lumen practice hint {ex.name}{_file_arg(ex, path)} {flag}")
    return 0


def _wrap(text: str, indent: int, first: int | None = None) -> str:
    lead = " " * (indent if first is None else first)
    return textwrap.fill(text, 110, initial_indent=lead, subsequent_indent=" " * indent)
