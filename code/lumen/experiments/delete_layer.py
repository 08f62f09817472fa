"""Experiment `delete-layer`: skip one block at a time and measure the held-out loss, on SmolLM2 and on a small
trained lumen model. The residual picture predicts that a middle layer can go with only mild damage."""

from __future__ import annotations

from typing import TypedDict

from ..inspect import deletion_table
from ..inspect.corpus import token_windows
from .result import Result, Table, figure
from .subjects import describe_trained, smollm2, trained_char_model

NAME = "delete-layer"
CLAIM = ("Because every block only adds to the stream, deleting a middle layer of a trained transformer degrades it "
         "only mildly: the stream survives without that layer's write.")

class Size(TypedDict):
    windows: int        # SmolLM2's held-out windows
    seq_len: int        # of this many tokens
    char_windows: int   # the small trained model's windows (of its context)


SIZES = {False: Size(windows=4, seq_len=128, char_windows=32), True: Size(windows=2, seq_len=32, char_windows=8)}
MODELS = {"smollm2": "SmolLM2-135M", "trained": "trained lumen (chars)"}


def summary(table: dict) -> dict:
    """The loss increase for the first block, the last, and the middle half (median and worst)."""
    deltas = [r["delta"] for r in table["rows"]]
    n = len(deltas)
    middle = sorted(deltas[n // 4: n - n // 4]) or deltas
    return {"baseline": table["baseline"], "first": deltas[0], "last": deltas[-1],
            "middle_median": middle[len(middle) // 2], "middle_max": max(middle), "deltas": deltas}


def measure(size: Size, seed: int, quick: bool = False) -> dict:
    """The held-out loss with each block deleted, on SmolLM2 and on the small trained model (its quick size)."""
    s = size
    model, tok = smollm2()
    windows = token_windows(tok, "shakespeare", "val", n=s["windows"], seq_len=s["seq_len"], seed=seed)
    big = summary(deletion_table(model, windows))
    cm, ctok, _ = trained_char_model(quick, seed)
    cwin = token_windows(ctok, "shakespeare", "val", n=s["char_windows"], seq_len=cm.cfg.context, seed=seed)
    return {"smollm2": big, "trained": summary(deletion_table(cm, cwin))}


def tables(n: dict, s: Size) -> list[Table]:
    rows = [[name, len(r["deltas"]), r["baseline"], r["first"], r["middle_median"], r["middle_max"], r["last"]]
            for name, r in ((MODELS[k], n[k]) for k in MODELS)]
    return [Table("Held-out loss (nats/token, Shakespeare's held-out works) and its increase when one block is "
                  "deleted", ["model", "blocks", "intact loss", "delete block 0", "delete a middle block (median)",
                              "middle (worst)", "delete the last block"], rows)]


def verdict(n: dict, s: Size) -> str:
    big, small = n["smollm2"], n["trained"]
    mild = big["middle_median"] < 0.1 * big["baseline"]
    return (f"On SmolLM2 deleting a middle block costs {big['middle_median']:+.3f} nats (median; worst "
            f"{big['middle_max']:+.3f}) on a loss of {big['baseline']:.2f}, against {big['first']:+.2f} for the "
            f"first block and {big['last']:+.3f} for the last"
            + (": mild, as the chapter says, while the first block is essential." if mild else
               ": not mild at this model size.")
            + f" The small trained model ({len(small['deltas'])} blocks) has no real middle: deleting its blocks "
            f"costs {', '.join(f'{d:+.2f}' for d in small['deltas'])}.")


def draw(n: dict, s: Size):
    """The loss increase for each deleted block, both models."""
    big, small = n["smollm2"], n["trained"]
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    ax1.bar(range(len(big["deltas"])), big["deltas"])
    ax1.set(xlabel="deleted block", ylabel="loss increase (nats)", yscale="symlog", title="SmolLM2-135M")
    ax2.bar(range(len(small["deltas"])), small["deltas"])
    ax2.set(xlabel="deleted block", ylabel="loss increase (nats)", title="trained lumen model (characters)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed, quick)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"delete-layer": draw(n, size)},
                  [f"The trained model is {describe_trained(quick, seed)}.",
                   f"{size['windows']} windows of {size['seq_len']} SmolLM2 tokens from the held-out works."])
