"""One self-contained HTML page for a lens: a layers x positions grid, each cell the top-1 token coloured
by its probability; hovering a cell shows the top-k tokens. Inline CSS only: no script, no network.

    >>> write_text("out/lens.html", lens_page(result))        # doctest: +SKIP
"""

from __future__ import annotations

from html import escape

from .. import names
from ..tokenizers.shown import shown

LIGHT, DARK = (247, 251, 255), (8, 48, 107)   # the colour scale's ends: probability 0 and 1

STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
table.lens { border-collapse: collapse; }
table.lens td, table.lens th { border: 1px solid #ccc; padding: 3px 6px; white-space: pre; }
table.lens th { background: #f3f3f3; font-weight: normal; }
td.cell { position: relative; min-width: 48px; text-align: center; font-family: monospace; }
td.cell .tip { display: none; position: absolute; left: 50%; top: 100%; z-index: 10; background: #fff;
  color: #222; border: 1px solid #888; padding: 4px 8px; box-shadow: 0 2px 6px #0004; text-align: left; }
td.cell:hover .tip { display: block; }
td.cell:hover { outline: 2px solid #e6550d; }
"""


def colour(p: float) -> str:
    """The cell colour of probability p: light to dark blue."""
    p = min(1.0, max(0.0, p))
    r, g, b = (round(lo + (hi - lo) * p) for lo, hi in zip(LIGHT, DARK))
    return f"rgb({r},{g},{b})"


def _show(text: str) -> str:
    return escape(shown(text))


def lens_page(result, title: str = "logit lens") -> str:
    """The whole page as a string (see the module docstring)."""
    T, k = len(result.tokens), result.top_ids.size(-1)
    head = "".join(f"<th>{_show(t)}</th>" for t in result.tokens)
    rows = []
    for layer in range(result.n_layers, -1, -1):                 # the last layer on top, as in the figures
        cells = []
        for t in range(T):
            p = float(result.top_probs[layer, t, 0])
            tops = "".join(
                f"<div>{_show(result.vocab_of(int(result.top_ids[layer, t, j])))}"
                f" &nbsp;{float(result.top_probs[layer, t, j]):.3f}</div>"
                for j in range(k)
            )
            tip = f"<div class='tip'><b>top {k}</b>{tops}<div>KL to final {float(result.kl[layer, t]):.3f}</div></div>"
            fg = "#fff" if p > 0.55 else "#000"
            word = _show(result.vocab_of(int(result.top_ids[layer, t, 0])))
            cells.append(f"<td class='cell' style='background:{colour(p)};color:{fg}'>{word}{tip}</td>")
        rows.append(f"<tr><th>{names.stream(layer)}</th>{''.join(cells)}</tr>")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        "<p>Each cell: the most likely next token read from the stream after that layer, coloured by its "
        "probability (white 0, dark blue 1). Hover a cell for the top tokens.</p>"
        f"<table class='lens'><tr><th>layer \\ input</th>{head}</tr>{''.join(rows)}</table>"
        "</body></html>\n"
    )
