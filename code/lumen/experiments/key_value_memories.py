"""Experiment `key-value-memories`: a handful of SmolLM2's MLP neurons, each with the contexts that make it fire
hardest (its key) and the tokens its value vector promotes (Geva et al. 2021)."""

from __future__ import annotations

from typing import TypedDict

from ..inspect import scan_layer
from ..inspect.corpus import token_windows
from ..tokenizers.shown import quoted
from .result import Result, Table, figure
from .subjects import smollm2

NAME = "key-value-memories"
CLAIM = ("Each MLP hidden unit is a key (a pattern in the input it responds to) and a value (a row of W2 that pushes "
         "the prediction toward specific next tokens): individual units respond to recognisable patterns, and their "
         "values promote related tokens.")

class Size(TypedDict):
    layers: list[int]   # the MLP layers scanned
    windows: int        # Shakespeare windows scanned
    seq_len: int        # of this many tokens
    show: int           # units reported per layer


SIZES = {False: Size(layers=[8, 22], windows=32, seq_len=128, show=4),
         True: Size(layers=[22], windows=4, seq_len=64, show=3)}


def measure(size: Size, seed: int) -> dict:
    """The clearest units of each scanned layer: their triggers, contexts and promoted tokens."""
    s = size
    model, tok = smollm2()
    windows = token_windows(tok, "shakespeare", "train", n=s["windows"], seq_len=s["seq_len"], seed=seed)
    return {"neurons": [r.to_dict() for layer in s["layers"]
                        for r in scan_layer(model, tok, windows, layer, k=10, show=s["show"])]}


def tables(n: dict, s: Size) -> list[Table]:
    rows = [[r["layer"], r["unit"], quoted(r["common_trigger"]), r["trigger_share"], r["top_activation"],
             " / ".join(c["marked"][-60:] for c in r["contexts"][:2]),
             " ".join(quoted(t) for t, _ in r["promoted"][:5]), r["agreement"]] for r in n["neurons"]]
    return [Table(f"SmolLM2-135M neurons with the clearest triggers ({s['windows']} windows of {s['seq_len']} "
                  "tokens of Shakespeare); [[token]] marks where the unit fired",
                  ["layer", "unit", "commonest trigger", "share of top-10 on it", "top activation",
                   "top contexts", "value promotes", "next token among promoted"], rows)]


def verdict(n: dict, s: Size) -> str:
    reports = n["neurons"]
    share = sum(r["trigger_share"] for r in reports) / len(reports)
    agree = sum(r["agreement"] for r in reports) / len(reports)
    return (f"The units shown fire on one recognisable trigger in {share:.0%} of their top contexts on average "
            "(keys that match input patterns, as Geva et al. found); their value vectors' promoted tokens include "
            f"the actual next token in {agree:.0%} of those contexts"
            + (" (values that push toward the right continuation)." if agree >= 0.2 else
               " (so at this scale the values rarely name the very next token; Geva et al. found agreement mostly "
               "in upper layers, and over far more text).")
            + " These are the clearest units of a scan, not typical ones.")


def draw(n: dict, s: Size):
    """The tokens the first units' values promote most."""
    reports = n["neurons"]
    fig, axes = figure(len(reports[: 3]), 4.2, 3.2)
    for ax, r in zip(axes, reports):
        ax.barh([t for t, _ in r["promoted"][:8]][::-1], [v for _, v in r["promoted"][:8]][::-1])
        ax.set(title=f"L{r['layer']} unit {r['unit']}: fires on {quoted(r['common_trigger'])}", xlabel="logit change")
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"key-value-memories": draw(n, size)})
