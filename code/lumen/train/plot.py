"""The loss curve of a run as a PNG: training loss per logged step, validation loss per evaluation."""

from __future__ import annotations

from pathlib import Path

from ..files import atomic_path


def plot_losses(history: list[dict], path: str | Path, title: str = "") -> Path:
    """Draw train and validation loss against step into path (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    train = [(r["step"], r["loss"]) for r in history if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in history if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
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
    plt.close(fig)
    return path
