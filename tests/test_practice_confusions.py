"""docs/confusions.md cannot drift from the code: every confusion has a snippet or a command, the Python
snippets are read out of the page and run (each in a fresh namespace, its assertions being what it shows),
the `lumen` commands run through the real command line, and the links into docs/experiments.md name
sections that exist."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from lumen.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "confusions.md"
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```", re.M | re.S)


def sections() -> list[tuple[str, str]]:
    """(heading, body) of every `## ` section."""
    parts = re.split(r"^## (.+)$", PAGE.read_text(), flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def snippets(language: str) -> list[tuple[str, int, str]]:
    """(section, line in the page, code) of every fenced block in `language`."""
    text = PAGE.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) == language:
            before = text[: m.start()]
            heading = re.findall(r"^## (.+)$", before, flags=re.M)[-1]
            out.append((heading, before.count("\n") + 2, m.group(2)))
    return out


def test_every_confusion_is_shown_by_a_snippet_or_a_command():
    assert len(sections()) >= 8
    for heading, body in sections():
        assert re.search(r"^```(python|bash)", body, re.M), heading


def test_the_links_into_experiments_name_sections_that_exist():
    experiments = (ROOT / "docs" / "experiments.md").read_text()
    anchors = set(re.findall(r"^## (\S+)$", experiments, re.M))
    links = re.findall(r"\]\(experiments\.md#([\w-]+)\)", PAGE.read_text())
    assert links and set(links) <= anchors, set(links) - anchors


PYTHON = snippets("python")


@pytest.mark.parametrize("snippet", PYTHON, ids=[f"line{line}" for _, line, _ in PYTHON])
def test_python_snippet_runs(snippet, capsys):
    heading, line, code = snippet
    exec(compile(code, f"{PAGE}:{line}", "exec"), {"__name__": "confusions"})


COMMANDS = [(h, line, cmd) for h, line, code in snippets("bash") for cmd in code.splitlines() if cmd.strip()]


@pytest.mark.parametrize("command", COMMANDS, ids=[c for _, _, c in COMMANDS])
def test_command_runs(command):
    heading, line, text = command
    words = shlex.split(text, comments=True)
    assert words[0] == "lumen", text
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(words[1:]) == 0, text
    assert out.getvalue().strip()
