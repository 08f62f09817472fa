"""A token as a reader sees it: the one way lumen prints a token's text, in a terminal table, a figure's cell,
the HTML pages and the experiments' prose.

A token's text is often nothing a reader can see: " " (a space), "\\n", "\\t", or a leading space that decides
which token it is (" Paris" is not "Paris"). Two forms, for two places:

    >>> shown("\\n"), shown(" "), shown("  "), shown(" Paris")     # in a cell: escaped, no quotes
    ('\\\\n', '␣', '␣␣', ' Paris')
    >>> shown(" Colosseum", width=8)                            # cut to a cell's width
    ' Coloss…'
    >>> quoted(" Paris"), quoted("\\n")                          # in a sentence or a list: quoted
    ("' Paris'", "'\\\\n'")
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

SPACE = "\u2423"  # ␣: what a token made only of spaces shows, one per space


class Decodes(Protocol):
    """Any tokenizer: lumen's, or one of Hugging Face's."""

    def decode(self, ids: list[int]) -> str: ...


def shown(text: str, width: int | None = None) -> str:
    """text for a cell: characters that do not print (newline, tab, other control characters) escaped as Python
    writes them (\\n, \\t, \\x00), a token of spaces as one ␣ per space; cut to `width` characters (the last
    one "…") where it is longer."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if not text.strip():
        text = text.replace(" ", SPACE)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def quoted(text: str) -> str:
    """text for a sentence or a list: quoted, so that a leading or trailing space shows (' Paris'), with the
    characters that do not print escaped (Python's repr)."""
    return repr(text)


def logit_name(target: str, minus: str | None = None) -> str:
    """A logit, or a difference of two, in words with the tokens quoted: "logit[' Mary'] - logit[' John']"."""
    name = f"logit[{quoted(target)}]"
    return name if minus is None else f"{name} - logit[{quoted(minus)}]"


def token_texts(tokenizer: Decodes | None, ids: Iterable[int]) -> list[str]:
    """Each id's token as its own text (any tokenizer with `decode`), or the id itself as text where there is
    no tokenizer."""
    return [tokenizer.decode([int(i)]) if tokenizer is not None else str(int(i)) for i in ids]
