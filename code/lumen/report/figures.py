"""PNG figures for the looking-inside tools, drawn with matplotlib's Agg canvas (no display, no pyplot state).

    >>> lens_heatmap(result, "out/lens.png")                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .. import names
from ..files import atomic_path
from ..tokenizers.shown import shown

MAX_POSITIONS = 32  # the heatmap shows at most the last 32 positions of a prompt


def _save(fig: Figure, path: str | Path) -> Path:
    FigureCanvasAgg(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    return Path(path)


def lens_heatmap(result, path: str | Path, title: str = "logit lens") -> Path:
    """Layers (rows, embedding at the bottom) x positions (columns): the lens's top-1 token written in
    each cell, coloured by its probability; the logit-lens post's picture."""
    T = len(result.tokens)
    cols = list(range(max(0, T - MAX_POSITIONS), T))
    probs = result.top_probs[:, cols, 0].numpy()                    # (layers, positions)
    n_layers = probs.shape[0]
    fig = Figure(figsize=(1.0 + 0.9 * len(cols), 1.0 + 0.28 * n_layers))
    ax = fig.add_subplot()
    im = ax.imshow(probs, origin="lower", aspect="auto", cmap="Blues", vmin=0, vmax=1)
    for r in range(n_layers):
        for c, t in enumerate(cols):
            word = shown(result.vocab_of(int(result.top_ids[r, t, 0])), 8)
            ax.text(c, r, word, ha="center", va="center", fontsize=6.5, color="white" if probs[r, c] > 0.6 else "black")
    ax.set_xticks(range(len(cols)), [shown(result.tokens[t], 10) for t in cols], rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(n_layers), [names.stream(i) for i in range(n_layers)], fontsize=7)
    ax.set_xlabel("input position (the cell predicts the token after it)")
    ax.set_ylabel("stream after")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="top-1 probability", fraction=0.03)
    return _save(fig, path)


def layer_curves(curves: dict[str, Sequence[float]], path: str | Path, ylabel: str = "KL to final output (nats)",
                 title: str = "lenses by layer", log: bool = False) -> Path:
    """One line per lens (or per quantity) against the stream: index 0 is the embedding, i + 1 block i's output."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    n = 0
    for name, ys in curves.items():
        ax.plot(range(len(ys)), ys, marker="o", markersize=3, label=name)
        n = max(n, len(ys))
    ticks = range(0, n, max(1, n // 12))
    ax.set_xticks(list(ticks), ["embed" if i == 0 else str(i - 1) for i in ticks])
    ax.set_xlabel("stream after block (embed = the embedding, before any block)")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def deletion_bars(table: dict, path: str | Path, title: str = "deleting one block") -> Path:
    """Loss increase on held-out text when each block is skipped."""
    rows = table["rows"]
    fig = Figure(figsize=(max(5.0, 0.25 * len(rows) + 2), 3.8))
    ax = fig.add_subplot()
    ax.bar([r["block"] for r in rows], [r["delta"] for r in rows], color="tab:red")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("deleted block")
    ax.set_ylabel(f"loss increase (nats/token; intact {table['baseline']:.3f})")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def head_scores_plot(scores: dict, path: str | Path, title: str = "attention heads by block") -> Path:
    """One panel per score: every head's score against its block."""
    names = list(scores)
    fig = Figure(figsize=(4.0 * len(names), 3.6), layout="constrained")   # the layout keeps the suptitle clear
    for k, name in enumerate(names):
        s = scores[name]
        ax = fig.add_subplot(1, len(names), k + 1)
        L, H = s.shape
        for layer in range(L):
            ax.scatter([layer] * H, s[layer].tolist(), s=10, alpha=0.7, color="tab:blue")
        ax.set_xlabel("block")
        ax.set_ylabel("score")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(name.replace("_", " "))
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def attribution_plot(a, path: str | Path, position: int = -1, title: str = "direct logit attribution") -> Path:
    """Left: each component's direct contribution at one position (bars, the embedding at the top);
    right: every head's contribution (layers x heads, red adds to the logit, blue takes away)."""
    t = position % len(a.ids)
    names, vals = a.components, a.values[:, t].numpy()
    fig = Figure(figsize=(11.0, max(4.0, 0.16 * len(names) + 1.5)))
    ax = fig.add_subplot(1, 2, 1)
    ax.barh(range(len(names)), vals, color=np.where(vals >= 0, "tab:red", "tab:blue"))
    ax.set_yticks(range(len(names)), [n.replace("blocks.", "") for n in names], fontsize=6)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"contribution (sum {float(a.logit[t]):.3f} = the logit)")
    ax.set_title(f"position {t} ({shown(a.tokens[t], 12)})", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    heads = a.heads[:, :, t].numpy()
    lim = float(np.abs(heads).max()) or 1.0
    ax2 = fig.add_subplot(1, 2, 2)
    im = ax2.imshow(heads, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax2.set_xlabel("head")
    ax2.set_ylabel("block")
    ax2.set_title("per head", fontsize=9)
    fig.colorbar(im, ax=ax2, fraction=0.04)
    fig.suptitle(title)
    return _save(fig, path)


def patching_plot(p, path: str | Path, title: str = "activation patching") -> Path:
    """One heatmap per site kind: the fraction of the clean metric each patch restores (0 white, 1 red)."""
    kinds = list(p.maps)
    fig = Figure(figsize=(4.2 * len(kinds), 0.5 + 0.14 * max(v.size(0) for v in p.maps.values()) + 1.5))
    for k, kind in enumerate(kinds):
        m = p.maps[kind].numpy()
        ax = fig.add_subplot(1, len(kinds), k + 1)
        im = ax.imshow(m, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        if kind == "head":
            ax.set_xlabel("head")
        else:
            ax.set_xticks(range(m.shape[1]), [shown(t, 8) for t in p.clean_tokens], rotation=60, ha="right",
                          fontsize=6)
        ax.set_ylabel("block")
        ax.set_title(kind.replace("_", " "), fontsize=9)
    fig.colorbar(im, ax=fig.axes, fraction=0.02)
    fig.suptitle(title)
    return _save(fig, path)
