"""Experiment `fact-recall`: "The Eiffel Tower is in the city of" -> " Paris", against "The Colosseum is in
the city of" -> " Rome" (the same 9 tokens in SmolLM2's tokenizer), on SmolLM2. Direct logit attribution
says which blocks and heads write " Paris" over " Rome" into the last position; activation patching says
where the information that decides it lives: at which positions and layers does a clean activation,
pasted into the Colosseum run, bring " Paris" back?"""

from __future__ import annotations

from typing import TypedDict

import torch

from .. import names
from ..inspect.attribution import attribute, top_components
from ..inspect.patching import logit_diff, patching_maps
from ..tokenizers import single_token
from ..tokenizers.shown import logit_name, quoted, shown
from .result import Result, Table, figure
from .subjects import smollm2

NAME = "fact-recall"
CLAIM = ("Early layers write facts about each token into its own stream; attention heads copy facts from other "
         "positions into this one; MLPs read the memory and write conclusions; late layers write 'the next token "
         "is probably X' (the chapter's picture of the residual stream as working memory).")
CLEAN, CORRUPT = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"
ANSWER, WRONG = " Paris", " Rome"


class Size(TypedDict):
    kinds: tuple[str, ...]  # the patching maps' site kinds
    step: int               # patch every step-th block


# quick: the stream only, every third block; full: every site kind at every block
SIZES = {False: Size(kinds=("resid_pre", "attn_out", "mlp_out", "head"), step=1),
         True: Size(kinds=("resid_pre",), step=3)}
MOVED = 0.5   # the last position "has" the answer once patching its stream restores this much


def measure(size: Size, seed: int = 0) -> dict:
    """Both prompts' predictions, direct logit attribution of the clean one, and patching's maps."""
    s = size
    model, tok = smollm2()
    clean, corrupt = tok.encode(CLEAN), tok.encode(CORRUPT)
    if len(clean) != len(corrupt):
        raise AssertionError(f"the two prompts must have the same token length: {len(clean)} vs {len(corrupt)}")
    a_id, b_id = single_token(tok, ANSWER, "answer"), single_token(tok, WRONG, "wrong")
    n, T = len(model.blocks), len(clean)
    with torch.no_grad():
        p_clean = model(torch.tensor([clean]))[0][0, -1].softmax(-1)
        p_corrupt = model(torch.tensor([corrupt]))[0][0, -1].softmax(-1)

    a = attribute(model, clean, contrast=(a_id, b_id), tokenizer=tok)
    attn = [float(a.row(names.write(i, "attn"))[-1]) for i in range(n)]
    mlp = [float(a.row(names.write(i, "mlp"))[-1]) for i in range(n)]
    total = float(a.logit[-1])
    late = range(n - n // 3, n)
    top = top_components(a, -1, 8)

    layers = list(range(0, n, s["step"]))
    p = patching_maps(model, clean, corrupt, logit_diff(a_id, b_id), kinds=s["kinds"], tokenizer=tok, layers=layers)
    resid = p.maps["resid_pre"]                                       # (len(layers), T)
    subject = [t for t in range(T) if clean[t] != corrupt[t]]         # the positions whose tokens differ
    moved = next((layers[r] for r in range(len(layers)) if float(resid[r, -1]) >= MOVED), None)
    numbers = {"clean": CLEAN, "corrupt": CORRUPT, "tokens": p.clean_tokens, "corrupt_tokens": p.corrupt_tokens,
               "p_answer_clean": float(p_clean[a_id]), "p_wrong_corrupt": float(p_corrupt[b_id]),
               "said_clean": tok.decode([int(p_clean.argmax())]), "said_corrupt": tok.decode([int(p_corrupt.argmax())]),
               "logit_diff_clean": p.clean_metric, "logit_diff_corrupt": p.corrupt_metric,
               "attribution": {"attn": attn, "mlp": mlp, "embed": float(a.values[0, -1]), "total": total,
                               "late_third_share": sum(attn[i] + mlp[i] for i in late) / total, "top": top,
                               "heads_last": a.heads[:, :, -1].tolist()},
               "patching": p.to_dict(), "moved_at_block": moved, "subject_positions": subject}
    if "head" in p.maps:
        hm = p.maps["head"]
        numbers["top_heads_patching"] = sorted(((float(hm[r, h]), layers[r], h) for r in range(len(layers))
                                                for h in range(hm.size(1))), reverse=True)[:5]
    return numbers


def maps(n: dict) -> dict[str, torch.Tensor]:
    """Patching's maps from the numbers: kind -> (blocks measured, positions or heads)."""
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in n["patching"]["maps"].items()}


def tables(n: dict, s: Size) -> list[Table]:
    layers, tokens, resid = n["patching"]["layers"], n["tokens"], maps(n)["resid_pre"]
    a = n["attribution"]
    rows = [[layers[r], *[round(float(v), 3) + 0.0 for v in resid[r]]] for r in range(len(layers))]   # no -0
    t_patch = Table("Patching the stream entering each block (resid_pre), one position at a time: the fraction of "
                    f"{logit_name(ANSWER, WRONG)} restored in the Colosseum run",
                    ["block", *[quoted(x) for x in tokens]], rows)
    t_attr = Table(f"Direct logit attribution of {logit_name(ANSWER, WRONG)} = {a['total']:.3f} at the last "
                   f"position of {CLEAN!r}: the largest components (heads counted separately)",
                   ["component", "contribution"], [[c, round(v, 3)] for c, v in a["top"]])
    found = [t_attr, t_patch]
    if "top_heads_patching" in n:
        found.append(Table("Patching one head's output (all positions): the heads that restore most",
                           ["block", "head", "restored"], [[b, h, round(v, 3)] for v, b, h in n["top_heads_patching"]]))
    return found


def verdict(n: dict, s: Size) -> str:
    a, m, tokens, subject = n["attribution"], maps(n), n["tokens"], n["subject_positions"]
    attn, mlp, total, top = a["attn"], a["mlp"], a["total"], a["top"]
    layers, moved = n["patching"]["layers"], n["moved_at_block"]
    L = len(attn)
    late = range(L - L // 3, L)
    resid = m["resid_pre"]
    best_subject = subject[int(resid[0, subject].argmax())]        # the subject token that matters most
    first_row = float(resid[0, best_subject])
    best_block = max(range(L), key=lambda i: attn[i] + mlp[i])
    head_text = ""
    if "top_heads_patching" in n:
        flat = n["top_heads_patching"]
        dla_heads = {(part.layer, part.head) for c, _ in top if (part := names.parse(c)).head is not None}
        both = [(b, h) for _, b, h in flat if (b, h) in dla_heads]
        named = ", ".join(f"{b}.{h}" for b, h in both)
        head_text = (" Patching single heads (block.head), the most restoring are "
                     + ", ".join(f"{b}.{h} ({v:.2f})" for v, b, h in flat[:3])
                     + (f"; {named} {'is' if len(both) == 1 else 'are'} also among the largest direct writers: "
                        "attention that moves the fact also writes the answer" if both else
                        "; none of them is among the largest direct writers") + ".")
    parts = [f"SmolLM2 says {quoted(n['said_clean'])} (p={n['p_answer_clean']:.2f}) after the Eiffel prompt and "
             f"{quoted(n['said_corrupt'])} (p={n['p_wrong_corrupt']:.2f}) after the Colosseum one."]
    if moved is not None:
        parts.append(f"Patching the stream, the answer sits at the subject's positions "
                     f"({', '.join(quoted(tokens[t]) for t in subject)}; {quoted(tokens[best_subject])} alone "
                     f"restores {first_row:.0%} at block {layers[0]}) until it moves to the last position at block "
                     f"{moved} of {L} (the last position alone then restores "
                     f"{float(resid[layers.index(moved), -1]):.0%}).")
    else:
        parts.append("Patching the last position's stream never restores half of the difference at the blocks "
                     "measured.")
    carried = None
    if "attn_out" in m:
        ao = m["attn_out"][:, -1]
        carried = int(ao.argmax())
        parts.append(f"The move is attention's: block {layers[carried]}'s attention output at the last position "
                     f"restores {float(ao[carried]):.0%} by itself.")
    if "mlp_out" in m:
        mo = m["mlp_out"][:, subject]
        r, c = divmod(int(mo.argmax()), len(subject))
        parts.append(f"At the subject, block {layers[r]}'s MLP output at {quoted(tokens[subject[c]])} restores "
                     f"{float(mo[r, c]):.0%}"
                     + (": an early MLP writes what the subject is." if layers[r] < L // 3 else "."))
    parts.append(f"Direct logit attribution: the last third of the blocks ({late.start}-{L - 1}) write "
                 f"{a['late_third_share']:.0%} of the logit difference ({total:.2f}); the largest writer is block "
                 f"{best_block} (attention {attn[best_block]:+.2f}, MLP {mlp[best_block]:+.2f}); the strongest "
                 f"components are {', '.join(f'{c} ({v:+.2f})' for c, v in top[:4])}.{head_text}")
    story = [first_row >= 0.5, moved is not None and moved >= L // 2, a["late_third_share"] >= 0.5,
             carried is None or float(m["attn_out"][carried, -1]) >= 0.3]
    summary = (("The chapter's picture holds here: the fact sits in the subject's own stream through the early and "
                "middle blocks, " + ("attention copies it to the last position late, " if carried is not None else
                                     "it reaches the last position late (attention's part: measured at full size), ")
                + "and the last blocks write the answer.") if all(story) else
               "The chapter's picture holds only in part here (see the numbers below).")
    return " ".join([summary] + parts[1:] + parts[:1])


def draw(n: dict, s: Size):
    """Each block's direct write to the answer, and the stream's patching map."""
    a, layers, tokens = n["attribution"], n["patching"]["layers"], n["tokens"]
    attn, mlp = a["attn"], a["mlp"]
    L, T = len(attn), len(tokens)
    fig, (ax1, ax2) = figure(2, 6.0, 5.0)
    ax1.barh([i - 0.2 for i in range(L)], attn, height=0.4, label="attention", color="tab:orange")
    ax1.barh([i + 0.2 for i in range(L)], mlp, height=0.4, label="MLP", color="tab:green")
    ax1.axvline(0, color="black", linewidth=0.8)
    ax1.invert_yaxis()
    ax1.set(xlabel=f"direct contribution to {logit_name(ANSWER, WRONG)}", ylabel="block",
            title="who writes the answer (last position)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3, axis="x")
    im = ax2.imshow(maps(n)["resid_pre"].numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax2.set_xticks(range(T), [shown(t) for t in tokens], rotation=60, ha="right", fontsize=7)
    ax2.set_yticks(range(len(layers)), [str(i) for i in layers], fontsize=6)
    ax2.set(ylabel="block (stream entering it)", title="patching the stream: fraction restored")
    fig.colorbar(im, ax=ax2, fraction=0.04)
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"fact-recall": draw(n, size)},
                  [f"Prompts: {CLEAN!r} (clean) and {CORRUPT!r} (corrupted), {len(n['tokens'])} tokens each in "
                   "SmolLM2's tokenizer.",
                   "Patching: one forward pass of the Colosseum prompt per cell, with that one activation copied from "
                   "the Eiffel run; 1 = the clean logit difference, 0 = the corrupted one."])
