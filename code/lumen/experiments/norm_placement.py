"""Experiment `norm-placement`: post-LN (x = LN(x + f(x))) against pre-LN (x = x + f(LN(x))) at several depths,
with and without learning-rate warm-up; and the per-layer gradient norms at initialisation."""

from __future__ import annotations

import math
import statistics
from typing import TypedDict

import torch
import torch.nn as nn

from ..block import TransformerBlock
from ..config import ModelConfig
from ..model import GPT
from .fit import expect, sample_batch, shakespeare, train_lm, unigram_loss
from .result import Result, Table, figure
from .stacks import build

NAME = "norm-placement"
CLAIM = ("Post-LN puts the norm on the residual highway: its gradients are uneven across layers (the chapter: larger "
         "at the bottom), it needs learning-rate warm-up and becomes unstable deep; pre-LN keeps the highway clean "
         "and trains without warm-up at any depth.")


class Size(TypedDict):
    depths: list[int]     # depths trained, each placement with and without warm-up
    d: int
    steps: int
    warmup: int           # the warm-up steps of the runs with warm-up
    lr: float
    batch: int
    eval_windows: int
    grad_depth: int       # the depth whose gradient per block is measured at init
    grad_batches: int     # over this many batches


SIZES = {
    False: Size(depths=[2, 6, 12], d=64, steps=150, warmup=30, lr=1e-3, batch=16, eval_windows=64, grad_depth=12,
                grad_batches=3),
    True: Size(depths=[2, 6], d=32, steps=20, warmup=5, lr=1e-3, batch=8, eval_windows=16, grad_depth=6,
               grad_batches=2),
}
PLACEMENTS = ("pre", "post")
# the gradient at init is measured for each placement with GPT-2's embeddings (N(0, 0.02^2), tied to the
# unembedding), with the same untied, and with embeddings of unit size (untied): the size the original
# transformer's sqrt(d) scaling gives the stream before the first block
EMBEDDINGS = {"": "GPT-2's (std 0.02, tied)", "-untied": "std 0.02, untied", "-unit": "unit size, untied"}


def part_norms(model: GPT, x: torch.Tensor, y: torch.Tensor) -> list[dict[str, float]]:
    """Per block, the gradient norm of its attention, its MLP and its two norms after one backward pass."""
    model.zero_grad(set_to_none=True)
    model.eval()
    _, loss = model(x, y)
    loss.backward()
    out = []
    for b in model.blocks:
        assert isinstance(b, TransformerBlock)
        parts = {"attention": b.attn, "mlp": b.mlp, "norms": nn.ModuleList([b.ln1, b.ln2])}
        out.append({k: math.sqrt(sum(float((p.grad.float() ** 2).sum()) for p in m.parameters() if p.grad is not None))
                    for k, m in parts.items()})
    model.zero_grad(set_to_none=True)
    return out


def unit_embeddings(model: GPT) -> GPT:
    """The model with its token and position tables scaled to std 1 (its unembedding untied beforehand)."""
    with torch.no_grad():
        model.tok_emb.weight.mul_(1 / 0.02)
        if model.pos_emb is not None:
            model.pos_emb.weight.mul_(1 / 0.02)
    return model


def measure(size: Size, seed: int) -> dict:
    """Each placement's gradient per block and part at init (three kinds of embedding), and every placement,
    warm-up and depth trained."""
    s = size
    data = shakespeare()
    T = 64

    def cfg(n: int, placement: str) -> ModelConfig:
        return ModelConfig(vocab_size=data.tokenizer.vocab_size, context=T, d_model=s["d"], n_layers=n, n_heads=4,
                           activation="gelu", norm_placement=placement)

    g = s["grad_depth"]
    batches = [sample_batch(data, "train", s["batch"], T, seed + i) for i in range(s["grad_batches"])]
    parts: dict[str, list[dict[str, float]]] = {}
    for placement in PLACEMENTS:
        for emb in EMBEDDINGS:
            torch.manual_seed(seed)
            c = cfg(g, placement)
            model = build(c.replace(tie_embeddings=not emb))
            if emb == "-unit":
                unit_embeddings(model)
            per_batch = [part_norms(model, x, y) for x, y in batches]
            parts[placement + emb] = [{k: statistics.fmean(pb[i][k] for pb in per_batch) for k in per_batch[0][i]}
                                      for i in range(g)]
    grads = {k: [math.sqrt(sum(v ** 2 for v in block.values())) for block in blocks] for k, blocks in parts.items()}
    runs = []
    expect(len(PLACEMENTS) * 2 * len(s["depths"]) * s["steps"])
    for placement in PLACEMENTS:
        for warmup in (0, s["warmup"]):
            for n in s["depths"]:
                torch.manual_seed(seed)
                h = train_lm(build(cfg(n, placement)), data, s["steps"], lr=s["lr"], warmup=warmup,
                             batch_size=s["batch"], seed=seed, eval_windows=s["eval_windows"])
                runs.append({"placement": placement, "warmup": warmup, "blocks": n, "diverged": h.diverged,
                             "val": h.final_val, "final_loss": h.final_loss})
    return {"unigram_loss": unigram_loss(data),
            "grad_norms_at_init": {p: grads[p] for p in PLACEMENTS},
            "grad_norms_at_init_untied": {p: grads[p + "-untied"] for p in PLACEMENTS},
            "grad_norms_at_init_unit_embeddings": {p: grads[p + "-unit"] for p in PLACEMENTS},
            "grad_parts_at_init": parts, "runs": runs}


GRADS = {"": "grad_norms_at_init", "-untied": "grad_norms_at_init_untied",
         "-unit": "grad_norms_at_init_unit_embeddings"}   # embeddings -> the numbers' key of their gradients


def gradients(n: dict) -> dict[str, list[float]]:
    """Every placement and embedding's gradient per block at init, keyed "pre", "pre-untied", ..., "post-unit"."""
    return {p + emb: n[GRADS[emb]][p] for p in PLACEMENTS for emb in EMBEDDINGS}


def val(n: dict, placement: str, warmup: int, blocks: int) -> float:
    """A run's validation loss (inf: it diverged)."""
    r = next(r for r in n["runs"] if (r["placement"], r["warmup"], r["blocks"]) == (placement, warmup, blocks))
    return float("inf") if r["diverged"] else r["val"]


def tables(n: dict, s: Size) -> list[Table]:
    parts, grads = n["grad_parts_at_init"], gradients(n)
    g = s["grad_depth"]
    rows = [[f"{r['placement']}-LN", f"{r['warmup']} steps" if r["warmup"] else "none"]
            + ["diverged" if x["diverged"] else x["val"] for x in n["runs"]
               if (x["placement"], x["warmup"]) == (r["placement"], r["warmup"])]
            for r in n["runs"] if r["blocks"] == s["depths"][0]]
    t1 = Table(f"Validation loss after {s['steps']} steps at peak lr {s['lr']} (Shakespeare, characters, d={s['d']}); "
               f"predicting character frequencies alone: {n['unigram_loss']:.3f}",
               ["placement", "warm-up"] + [f"{k} blocks" for k in s["depths"]], rows)
    mid = {k: statistics.median(v[1:-1]) for k, v in grads.items()}
    t2 = Table(f"Gradient norm of each block's parameters at initialisation, {g} blocks (mean over "
               f"{s['grad_batches']} batches); block 0 is the bottom, block {g - 1} the top",
               ["placement", "embeddings"] + [f"block {i}" for i in range(g)]
               + ["block 0 / middle", f"block {g - 1} / middle"],
               [[f"{k.split('-')[0]}-LN", EMBEDDINGS[k[len(k.split('-')[0]):]]] + v
                + [v[0] / mid[k], v[-1] / mid[k]] for k, v in grads.items()])
    t3 = Table("Block 0's gradient at initialisation, by part (GPT-2's embeddings)",
               ["placement", "attention", "MLP", "norms", "block 1's attention"],
               [[f"{p}-LN", parts[p][0]["attention"], parts[p][0]["mlp"], parts[p][0]["norms"],
                 parts[p][1]["attention"]] for p in PLACEMENTS])
    return [t1, t2, t3]


def verdict(n: dict, s: Size) -> str:
    deep, w = max(s["depths"]), s["warmup"]

    def v(p, wu, k=deep):
        return val(n, p, wu, k)

    unigram = n["unigram_loss"]
    stuck = {(p, wu): [k for k in s["depths"] if abs(v(p, wu, k) - unigram) < 0.05] for p in PLACEMENTS
             for wu in (0, w)}
    post_needs_warmup = v("post", 0) > v("post", w) + 0.02
    pre_fine = v("pre", 0) <= v("pre", w) + 0.05
    post_worse_deep = v("post", w) > v("pre", w) + 0.02

    def blocks(ns):
        return " and ".join(str(k) for k in ns) + " blocks"

    failed = ""
    if stuck["post", 0] or stuck["post", w]:
        both = sorted(set(stuck["post", 0]) & set(stuck["post", w]))
        failed = (f" Post-LN fails to train at {blocks(both)} with and without warm-up: it stays at the loss of "
                  f"predicting character frequencies ({unigram:.2f})." if both else
                  f" Post-LN stays at the character-frequency loss ({unigram:.2f}) at {blocks(stuck['post', 0])} "
                  f"without warm-up and at {blocks(stuck['post', w]) if stuck['post', w] else 'no depth'} with it.")
    return (gradient_verdict(gradients(n), n["grad_parts_at_init"])
            + f"At {deep} blocks without warm-up post-LN reaches {v('post', 0):.3f}, with warm-up "
            f"{v('post', w):.3f}" + (" (it needs warm-up)" if post_needs_warmup else
                                     " (warm-up does not rescue it here; it is worse with warm-up at every depth)"
                                     if all(v("post", w, k) > v("post", 0, k) for k in s["depths"]) else
                                     " (warm-up does not rescue it here)")
            + f"; pre-LN reaches {v('pre', 0):.3f} without and {v('pre', w):.3f} with"
            + (" (it trains without warm-up)" if pre_fine else " (it too does better with warm-up at this depth "
                                                               "and learning rate)")
            + (", and post-LN is behind pre-LN deep." if post_worse_deep else
               ". Post-LN is not behind pre-LN at this depth and budget; its instability needs deeper models "
               "or longer runs than this budget.")
            + failed)


def draw(n: dict, s: Size):
    """The gradient per block at init, and the validation loss against depth with and without warm-up."""
    grads = gradients(n)
    g, w = s["grad_depth"], s["warmup"]
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for k, norms in grads.items():
        ax1.plot(range(g), norms, {"": "o-", "-untied": "^:", "-unit": "s--"}[k[len(k.split('-')[0]):]],
                 label=f"{k.split('-')[0]}-LN, {EMBEDDINGS[k[len(k.split('-')[0]):]]}")
    for p in PLACEMENTS:
        for wu, ls in ((0, "--"), (w, "-")):
            ax2.plot(s["depths"], [val(n, p, wu, k) for k in s["depths"]], ls, marker="o",
                     label=f"{p}-LN, warm-up {wu}")
    ax1.set(xlabel="block", ylabel="gradient norm", yscale="log", title=f"gradient per block at init ({g} blocks)")
    ax2.set(xlabel="blocks", ylabel="validation loss", title=f"after {s['steps']} steps, lr {s['lr']}")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


NOTES = ["Both placements use lumen's GPT-2 initialisation (embeddings and weights N(0, 0.02^2), stream writes "
         "scaled by 1/sqrt(2N)); the original post-LN transformer scaled its embeddings by sqrt(d), which the "
         "unit-size rows stand for (token and position tables scaled to std 1, the unembedding untied so that it "
         "keeps its own N(0, 0.02^2)).",
         "Xiong et al. (2020) analyse and measure post-LN at init: the gradient of the last layers' parameters is "
         "large and does not shrink with depth, while pre-LN's scales as 1/sqrt(L)."]


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"norm-placement": draw(n, size)}, list(NOTES))


def gradient_verdict(grads: dict[str, list[float]], parts: dict[str, list[dict[str, float]]]) -> str:
    """What the gradients per block at init show, in sentences built from the numbers."""
    post, untied, unit, pre = grads["post"], grads["post-untied"], grads["post-unit"], grads["pre"]
    g = len(post)

    def middle(v: list[float]) -> float:
        return statistics.median(v[1:-1])

    spike, flat = post[0] / middle(post), max(post[1:]) / min(post[1:])
    attention = (parts["post"][0]["attention"] / post[0]) ** 2   # its share of the block's squared gradient
    u_bottom, u_top = unit[0] / middle(unit), unit[-1] / middle(unit)
    if u_top > 1.3 and u_bottom < 1.3:
        trend = "larger at the top, as Xiong et al. (2020) report, not at the bottom as the chapter says"
    elif u_bottom > 1.3 and u_top < 1.3:
        trend = "larger at the bottom, as the chapter says"
    else:
        trend = "even"
    pre_trend = f"Pre-LN's gradients fall gently from bottom to top ({pre[0] / pre[-1]:.2f}x). "
    if spike > 1.5 and flat < 1.3 and trend == "even":
        return (f"Measured block by block at init, post-LN's gradients are even across blocks 1 to {g - 1} (within "
                f"{flat:.2f}x) and only block 0 is larger, {spike:.1f}x the middle blocks with GPT-2's embeddings "
                f"(std 0.02), an effect of the embeddings' small scale: with embeddings of unit size it is "
                f"{u_bottom:.2f}x (the top block {u_top:.2f}x), so neither the chapter's larger-at-the-bottom nor "
                "Xiong et al.'s (2020) larger-at-the-top shows as a trend through depth at this size. "
                f"Block 0's excess is in its attention ({attention:.1%} of its squared gradient): post-LN's first "
                "norm divides the embedding's small stream back to unit size, which multiplies the gradient of the "
                f"attention below it; untying the unembedding changes nothing ({untied[0] / middle(untied):.1f}x). "
                + pre_trend)
    return (f"Measured block by block at init, post-LN's gradients with embeddings of unit size are {trend} "
            f"(block 0 {u_bottom:.2f}x and block {g - 1} {u_top:.2f}x the middle blocks'); with GPT-2's embeddings "
            f"(std 0.02) block 0 is {spike:.2f}x the middle blocks and blocks 1 to {g - 1} are within {flat:.2f}x of "
            "each other. " + pre_trend)
