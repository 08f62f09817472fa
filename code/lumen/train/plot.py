"""The loss curve of a run as a PNG: training loss per logged step, validation loss per evaluation."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..files import atomic_path


def plot_losses(history: list[dict], path: str | Path, title: str = "") -> Path:
    """Draw train and validation loss against step into path (written atomically)."""
    path = Path(path)
    train = [(r["step"], r["loss"]) for r in history if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in history if "val_loss" in r]
    fig = Figure(figsize=(7, 4), dpi=100)   # drawn off-screen on Agg's canvas: no pyplot state, no display
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if train:
        ax.plot(*zip(*train), lw=1, alpha=0.8, label="train")
    if val:
        ax.plot(*zip(*val), "o-", lw=1.5, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    return path
