"""The README and the docs cannot drift from the code: their fenced commands and Python snippets are read out of
README.md and docs/*.md (parsed, so a new section is covered the moment it is written) and checked against the
real `lumen` parser; in the slow tier (`make test-slow`) the quick ones run (seconds each) and so do the long ones
(training, whole experiments, a pass over a corpus with a pretrained model), in each page's order, in one folder,
as a newcomer would type them after `make`.

What "quick" means is a rule on the command, not a list of the README's lines: `count`, `experiment list`,
`--help`/`--version`/`--print-config`, `lens` (one forward pass) and `generate` with a pretrained model (run
with 8 new tokens; as written, with the slow set) are quick; every other command, and a Python snippet that
trains, is long.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.signals import ctrl_c_restored
from lumen.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(?<!`)`((?:\.venv/bin/)?lumen [^`]+)`")


@dataclass(frozen=True)
class Command:
    page: str      # README.md or docs/NAME.md
    line: int      # where it starts in the page
    text: str      # as written, continuation lines joined
    argv: tuple    # the words after `lumen` (empty for a command that is not lumen's)
    program: str   # lumen, make, or the first word
    stdout: str | None = None   # `> FILE`: where the command's output goes

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of every fenced block."""
    return [(m.group(1), text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text)]


def lumen_argv(words: list[str]) -> tuple[str, tuple]:
    """('lumen', argv) for `lumen ...`, `.venv/bin/lumen ...`, `python -m lumen ...`, `torchrun ... -m lumen ...`."""
    if not words:
        return "", ()
    if Path(words[0]).name == "lumen":
        return "lumen", tuple(words[1:])
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "lumen":
            return "lumen", tuple(words[i + 2:])
    return Path(words[0]).name, ()


def shell_commands(text: str, page: str) -> list[Command]:
    """Every command of every bash/sh/shell block (continuation lines joined, comments dropped)."""
    out = []
    for lang, first, body in fenced_blocks(text):
        if lang not in ("bash", "sh", "shell"):
            continue
        lines = body.split("\n")
        i = 0
        while i < len(lines):
            start, joined = i, lines[i]
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            words = shlex.split(joined.removeprefix("$ "), comments=True)
            stdout = None
            if ">" in words[:-1]:  # a redirection: the words before it are the command
                stdout, words = words[words.index(">") + 1], words[: words.index(">")]
            if words:
                program, argv = lumen_argv(words)
                out.append(Command(page, first + start, " ".join(joined.split("#")[0].split()) if "#" in joined
                                   else " ".join(joined.split()), argv, program, stdout))
    return out


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def python_snippets(text: str, page: str) -> list[Snippet]:
    return [Snippet(page, first, body) for lang, first, body in fenced_blocks(text) if lang in ("python", "py")]


def inline_lumen(text: str) -> list[tuple[int, list[str]]]:
    """`lumen ...` spans in the prose (not in fenced blocks), as words."""
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [(prose.count("\n", 0, m.start()) + 1, m.group(1).split()) for m in INLINE.finditer(prose)]


TEXTS = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in PAGES}
COMMANDS = [c for page, text in TEXTS.items() for c in shell_commands(text, page)]
LUMEN = [c for c in COMMANDS if c.program == "lumen"]
SNIPPETS = [s for page, text in TEXTS.items() for s in python_snippets(text, page)]


def quick(argv: tuple) -> bool:
    """A command that finishes in seconds (see the module docstring)."""
    if {"--help", "-h", "--version", "--print-config"} & set(argv):
        return True
    if argv[:1] == ("count",) or argv[:2] == ("experiment", "list"):
        return True
    if argv[:1] == ("lens",):
        return "--tuned" not in argv
    if argv[:1] == ("generate",):
        compiles = {"--compile", "--aot"} & set(argv)
        return not compiles and not argv[1].startswith("runs/")   # a run needs `lumen train` first
    return False


QUICK_TOKENS = "8"


def shortened(argv: tuple) -> list[str]:
    """A quick command as run: `generate` writes QUICK_TOKENS tokens (the page's own count runs with the long ones)."""
    argv = list(argv)
    if argv[:1] == ["generate"]:
        if "--max-new-tokens" in argv:
            argv[argv.index("--max-new-tokens") + 1] = QUICK_TOKENS
        else:
            argv += ["--max-new-tokens", QUICK_TOKENS]
    return argv


def snippet_is_quick(code: str) -> bool:
    return not re.search(r"\btrain\(", code)


def subparser(argv: list[str]) -> argparse.ArgumentParser:
    """The (sub-)subparser that argv's leading command words select, e.g. `tuned-lens train`."""
    p = build_parser()
    for word in argv:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        p = subs[0].choices[word]
    return p


def parse(argv) -> argparse.Namespace:
    """The real parser on argv; a parse error (argparse exits) becomes a test failure with its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(list(argv))
    except SystemExit as e:
        if e.code:
            pytest.fail(f"does not parse: {err.getvalue().strip()}")
        raise


# --- every command parses -------------------------------------------------------------------------------

def test_the_readme_has_commands_and_snippets():
    """The parser above finds what is there (pages without commands would make every test below vacuous)."""
    assert len(LUMEN) >= 10 and SNIPPETS
    assert any(c.argv[:1] == ("train",) for c in LUMEN) and any(quick(c.argv) for c in LUMEN)


@pytest.mark.parametrize("cmd", LUMEN, ids=str)
def test_every_lumen_command_parses(cmd):
    args = parse(cmd.argv)
    assert args.command == cmd.argv[0]


TRAINING_PAGES = sorted({c.page for c in LUMEN if c.argv[:1] == ("train",)})


@pytest.mark.parametrize("page", TRAINING_PAGES)
def test_every_training_command_resolves_its_config(page, tmp_path, monkeypatch, capsys):
    """Each `lumen train` of a page, under torchrun too, in the page's order (a config a command writes is there
    for the next): its preset, file and settings resolve to a config lumen accepts (`--print-config` checks it
    as a run would), so settings that conflict fail here in seconds, not when a reader runs them."""
    monkeypatch.chdir(tmp_path)
    for cmd in (c for c in LUMEN if c.page == page and c.argv[:1] == ("train",)):
        config = next((w for w in cmd.argv[1:2] if not w.startswith("-")), None)
        if config is not None and not Path(config).exists():
            continue  # a template's file (CONFIG.toml): nothing wrote it
        code = main([*cmd.argv, *([] if "--print-config" in cmd.argv else ["--print-config"])])
        out = capsys.readouterr().out
        assert code == 0, str(cmd)
        if cmd.stdout:
            Path(cmd.stdout).write_text(out)


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.program == "make"], ids=str)
def test_every_make_command_names_a_target(cmd):
    makefile = (ROOT / "Makefile").read_text()
    targets = [w for w in cmd.text.split()[1:] if not w.startswith("-") and "=" not in w] or ["all"]
    for t in targets:
        assert re.search(rf"^{re.escape(t)}:", makefile, re.M), f"{cmd}: no target {t!r} in the Makefile"


def test_every_option_named_in_the_prose_exists():
    """`lumen X ... --opt` in the prose (not a whole command) names a real command and real options of it."""
    wrong = []
    commands = {c.argv[0] for c in LUMEN} | set(build_parser()._subparsers._group_actions[0].choices)
    for page, text in TEXTS.items():
        for line, words in inline_lumen(text):
            if not words[1].startswith("-") and not words[1].isupper() and words[1] not in commands:  # COMMAND: a name
                wrong.append(f"{page}:{line}: {' '.join(words)}: no such command")
                continue
            p = subparser(words[1:])
            known = {s for a in p._actions for s in a.option_strings}
            wrong += [f"{page}:{line}: {' '.join(words)}: {w.split('=')[0]} is not an option of {p.prog}"
                      for w in words if w.startswith("--") and w.split("=")[0].strip("[]") not in known]
    assert not wrong, "\n".join(wrong)


def test_the_readme_is_a_newcomers_page():
    """Short enough to read in ten minutes, and it points to the pages that hold the rest, each of which exists."""
    text = TEXTS["README.md"]
    assert len(text.splitlines()) <= 200
    linked = set(re.findall(r"`(docs/[\w-]+\.md)`", text))
    assert {"docs/reading-guide.md", "docs/training.md", "docs/inspecting.md", "docs/speed.md"} <= linked
    assert all((ROOT / page).is_file() for page in linked), linked
    assert "source .venv/bin/activate" in text   # lumen is not on PATH in a fresh shell without it


# --- the quick ones run ---------------------------------------------------------------------------------

def needs_smollm2(text: str, request) -> None:
    if re.search(r"\bsmollm2\b(?!-)", text):
        request.getfixturevalue("smollm2_gguf")   # fetched once per machine, then read from the cache


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in LUMEN if quick(c.argv)], ids=str)
def test_quick_commands_run(cmd, request, tmp_path, monkeypatch, capsys):
    needs_smollm2(cmd.text, request)
    monkeypatch.chdir(tmp_path)            # outputs such as out/lens land in a temporary folder
    try:
        code = main(shortened(cmd.argv))
    except SystemExit as e:                # --help, --version
        code = e.code
    out, err = capsys.readouterr()
    assert code == 0, f"{cmd}\n{err}"
    assert out.strip(), f"{cmd}: printed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if snippet_is_quick(s.code)], ids=str)
def test_quick_python_snippets_run(snippet, request, tmp_path, monkeypatch):
    needs_smollm2(snippet.code, request)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet.code, str(snippet), "exec"), {"__name__": "docs"})


# --- the long ones, in each page's order, in one folder per page: the slow tier ------------------------------

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """page -> the folder its long commands run in, in the page's order (so `generate runs/small` finds the run an
    earlier command trained); it starts as `make` leaves a checkout: its README, `runs/shakespeare` trained."""
    made: dict[str, Path] = {}

    def folder(page: str) -> Path:
        if page not in made:
            made[page] = root = tmp_path_factory.mktemp(page.replace("/", "-").removesuffix(".md"))
            (root / "some.txt").write_text("It is the east, and Juliet is the sun.\n" * 20)
            (root / "README.md").write_text((ROOT / "README.md").read_text())  # (a page's text to read)
        return made[page]
    return folder


@pytest.fixture(scope="session")
def made_run(tmp_path_factory) -> Path:
    """What `make` leaves in a checkout: the default run (trained briefly; only when a page needs it)."""
    root = tmp_path_factory.mktemp("make")
    assert main(trained_briefly(("train", "--preset", "shakespeare", "--set",
                                 f"out_dir={root / 'runs' / 'shakespeare'}"))) == 0
    return root / "runs" / "shakespeare"


TRAIN_STEPS = "200"


def trained_briefly(argv: tuple) -> list[str]:
    """A training command as the slow tier runs it: the page's settings, with fewer steps unless the page
    gives a number (the rest of a long preset, minutes more of the same loop, proves nothing new)."""
    argv = list(argv)
    if argv[:1] == ["train"] and not any(w.startswith("steps=") for w in argv) and "--print-config" not in argv:
        argv += ["--set", f"steps={TRAIN_STEPS}"]
    return argv


def serves(argv: list[str], cwd: Path) -> None:
    """`lumen serve`: started, asked for its page once, stopped (it serves until Ctrl-C)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "code"), "PYTHONFAULTHANDLER": "1"}  # (SIGABRT: every stack)
    argv = [w if w != "8765" else "0" for w in argv]   # a free port: another server may hold the README's
    p = subprocess.Popen([sys.executable, "-m", "lumen", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_restored)
    try:
        line = p.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, f"lumen serve said {line!r}; {p.stderr.read() if p.poll() is not None else ''}"
        with urllib.request.urlopen(url.group(0), timeout=600) as page:
            assert page.status == 200 and b"<html" in page.read(2000).lower()
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:  # it did not stop: where each of its threads stands, then fail
            p.send_signal(signal.SIGABRT)
            _, err = p.communicate(timeout=60)
            pytest.fail(f"lumen serve did not stop within 60 s of Ctrl-C; its threads:\n{err[-6000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in LUMEN if not quick(c.argv) or shortened(c.argv) != list(c.argv)
                                 or c.stdout], ids=str)
def test_long_commands_run(cmd, request, folders, monkeypatch, capsys):
    if any(w.isupper() and len(w) > 2 for w in cmd.text.split()):
        pytest.skip(f"{cmd}: a template (placeholders in capitals)")
    if Path(cmd.text.split()[0]).name != "lumen":
        pytest.skip(f"{cmd}: runs lumen under another program (its lumen part is parsed above)")
    needs_smollm2(cmd.text, request)
    root = folders(cmd.page)
    monkeypatch.chdir(root)
    if "runs/shakespeare" in cmd.argv and not (root / "runs" / "shakespeare").exists():
        (root / "runs").mkdir(exist_ok=True)
        (root / "runs" / "shakespeare").symlink_to(request.getfixturevalue("made_run"))
    if cmd.argv[0] == "serve":
        serves(list(cmd.argv), root)
        return
    code = main(trained_briefly(cmd.argv))
    out = capsys.readouterr().out
    if cmd.argv[:2] == ("practice", "check"):  # a fresh starter file fails its checks (exit 1): not an error (2)
        assert code in (0, 1) and "FAILED" in out or code == 0, f"{cmd}\n{out}"
        return
    assert code == 0, str(cmd)
    if cmd.stdout:
        Path(cmd.stdout).write_text(out)


@pytest.mark.slow
@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if not snippet_is_quick(s.code)], ids=str)
def test_long_python_snippets_run(snippet, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet.code, str(snippet), "exec"), {"__name__": "docs"})
