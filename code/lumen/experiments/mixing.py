"""Experiment `mixing`: attention mixes, the MLP computes. A task that needs a new nonlinear feature of each
token (the XOR of two of its own binary features) for an attention-only stack and for full blocks; and the
validation-loss gap of attention-only against full blocks on Shakespeare."""

from __future__ import annotations

from typing import TypedDict

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..model import GPT
from .fit import TaskData, expect, shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "mixing"
CLAIM = ("Attention outputs are convex combinations of value vectors: mixing is not thinking. A new nonlinear feature "
         "of a token (here: the XOR of two of its features) is out of reach for attention alone and easy with the MLP.")


class Size(TypedDict):
    features: int       # binary features per token (2**features tokens)
    context: int        # tokens per window of the XOR task
    d: int              # the XOR stacks' width
    layers: int         # the XOR stacks' depth (attention-only also at three times it: the same parameters)
    steps: int          # XOR training steps
    batch: int          # XOR windows per step
    lm_layers: int      # the Shakespeare models' depth
    lm_d: int           # and width
    lm_steps: int
    lm_batch: int
    eval_windows: int   # Shakespeare validation windows


SIZES = {
    False: Size(features=4, context=16, d=64, layers=2, steps=400, batch=32, lm_layers=4, lm_d=96, lm_steps=300,
                lm_batch=16, eval_windows=64),
    True: Size(features=4, context=16, d=32, layers=2, steps=100, batch=16, lm_layers=2, lm_d=32, lm_steps=30,
               lm_batch=8, eval_windows=16),
}


class OwnFeatureXor:
    """Tokens that carry `features` binary features, as fixed embeddings e(t) = sum_k +-c_k (random directions
    c_k, frozen: the features the token brings, which training cannot rewrite into a lookup of the answer).
    The target at every position is XOR of the token's own features 0 and 1, a feature no token carries
    (it is not a linear function of e(t)); the other tokens in the context are irrelevant to it."""

    def __init__(self, features: int, d_model: int, context: int, seed: int):
        self.features, self.context = features, context
        self.gen = torch.Generator().manual_seed(seed)
        n = 2**features
        self.bits = torch.tensor([[(t >> k) & 1 for k in range(features)] for t in range(n)])
        code = torch.randn(features, d_model, generator=self.gen) / d_model**0.5
        self.embedding = torch.zeros(n + 2, d_model)
        self.embedding[:n] = (2 * self.bits.float() - 1) @ code
        self.answer = n + (self.bits[:, 0] ^ self.bits[:, 1])   # two answer tokens after the n input tokens

    @property
    def vocab_size(self) -> int:
        return len(self.embedding)

    def sequence(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One window: random tokens (context,) and each one's answer."""
        x = torch.randint(0, 2**self.features, (self.context,), generator=gen)
        return x, self.answer[x]

    def data(self) -> TaskData:
        """The task as the training loop reads a corpus."""
        return TaskData(self.sequence, self.vocab_size, self.context)

    def model(self, cfg: ModelConfig, kind: str) -> GPT:
        """A stack of `kind` whose input embedding is the task's frozen feature code (output head untied)."""
        model = build(cfg.replace(vocab_size=self.vocab_size, context=self.context, tie_embeddings=False), kind)
        with torch.no_grad():
            model.tok_emb.weight.copy_(self.embedding)
        model.tok_emb.weight.requires_grad_(False)
        return model

    @torch.no_grad()
    def evaluate(self, model: GPT, n: int = 256) -> tuple[float, float]:
        """(loss, accuracy) on n fresh sequences."""
        model.eval()
        x = torch.randint(0, 2**self.features, (n, self.context), generator=self.gen)
        y = self.answer[x]
        logits, loss = model(x, y)
        return loss.item(), (logits.argmax(-1) == y).float().mean().item()


def steps_to(loss: list[float], level: float, window: int = 10) -> int | None:
    """The first step at which the mean training loss over `window` steps falls below `level`."""
    for i in range(window, len(loss) + 1):
        if sum(loss[i - window:i]) / window < level:
            return i
    return None


def measure(size: Size, seed: int) -> dict:
    """Train the three XOR stacks and the two Shakespeare models (all through lumen.train's loop): the numbers."""
    s = size
    task = OwnFeatureXor(s["features"], s["d"], s["context"], seed)
    base = ModelConfig(d_model=s["d"], n_layers=s["layers"], n_heads=4, activation="gelu")
    variants = {  # label -> (kind, layers)
        f"full blocks, {s['layers']} layers": ("residual", s["layers"]),
        f"attention-only, {s['layers']} layers": ("attention-only", s["layers"]),
        f"attention-only, {3 * s['layers']} layers (same parameters)": ("attention-only", 3 * s["layers"]),
    }
    xor = {}
    expect(len(variants) * s["steps"] + 2 * s["lm_steps"])
    for label, (kind, layers) in variants.items():
        torch.manual_seed(seed)
        model = task.model(base.replace(n_layers=layers), kind)
        params = sum(p.numel() for p in model.blocks.parameters())
        hist = train_lm(model, task.data(), s["steps"], lr=1e-2, warmup=s["steps"] // 10, batch_size=s["batch"],
                        seed=seed, eval_windows=16)
        loss, acc = task.evaluate(model)
        xor[label] = {"loss": loss, "accuracy": acc, "block_parameters": params,
                      "steps_to_0.1": steps_to(hist.loss, 0.1), "train_loss": hist.loss}

    data = shakespeare()
    lm_cfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=64, d_model=s["lm_d"],
                         n_layers=s["lm_layers"], n_heads=4, activation="gelu")
    lm = {}
    for kind in ("residual", "attention-only"):
        torch.manual_seed(seed)
        h = train_lm(build(lm_cfg, kind), data, s["lm_steps"], lr=2e-3, warmup=s["lm_steps"] // 10,
                     batch_size=s["lm_batch"], seed=seed, eval_windows=s["eval_windows"])
        lm[kind] = {"final_loss": h.final_loss, "val": h.final_val, "train_loss": h.loss}
    chance = F.cross_entropy(torch.zeros(1, 2), torch.tensor([0])).item()   # ln 2: guessing
    return {"xor": xor, "shakespeare": lm, "chance_loss": chance}


def tables(n: dict, s: Size) -> list[Table]:
    t1 = Table(f"XOR of two of a token's own features, {s['steps']} steps, d={s['d']} (chance: loss ln 2 = "
               f"{n['chance_loss']:.3f}, accuracy 0.5)",
               ["stack", "block parameters", "loss", "accuracy", "steps to loss < 0.1"],
               [[label, r["block_parameters"], r["loss"], r["accuracy"], r["steps_to_0.1"] or f"not in {s['steps']}"]
                for label, r in n["xor"].items()])
    t2 = Table(f"Shakespeare (characters), {s['lm_layers']} layers, d={s['lm_d']}, {s['lm_steps']} steps",
               ["stack", "train loss", "val loss"],
               [[k, r["final_loss"], r["val"]] for k, r in n["shakespeare"].items()])
    return [t1, t2]


def verdict(n: dict, s: Size) -> str:
    steps = s["steps"]
    full, attn, attn3 = n["xor"].values()
    lm = n["shakespeare"]
    gap = lm["attention-only"]["val"] - lm["residual"]["val"]
    solved = full["accuracy"] > 0.95
    attn_solved = max(attn["accuracy"], attn3["accuracy"]) > 0.95
    fails = max(attn["accuracy"], attn3["accuracy"]) < 0.75

    def speed(r: dict) -> str:
        k = r["steps_to_0.1"]
        return f"{k} steps" if k else f"not within {steps} steps"

    details = (f"With the MLP: accuracy {full['accuracy']:.3f}, loss {full['loss']:.2g}, loss < 0.1 after "
               f"{speed(full)}; attention alone: {attn['accuracy']:.3f} (loss {attn['loss']:.2g}, {speed(attn)}) with "
               f"the same layers and {attn3['accuracy']:.3f} (loss {attn3['loss']:.2g}, {speed(attn3)}) with three "
               "times as many. ")
    if solved and fails:
        head = "The MLP learns the XOR and attention alone does not: mixing is not thinking, as the chapter says. "
    elif solved and attn_solved:
        head = ("Attention alone learns the XOR too, so the claim that it cannot compute a new feature of a token "
                "does not hold here; the MLP learns it faster. Attention has nonlinearities of its own (the softmax "
                "over query-key products, which include the token's own q.k, a quadratic form of its features; and "
                "the norms), presumably what computes it here: the chapter's 'except the softmax' caveat matters. ")
    elif solved:
        head = ("The MLP learns the XOR; attention alone gets part of the way, through its softmax (the chapter's "
                "'except the softmax' caveat) and the norms, and more slowly. ")
    else:
        head = f"Neither stack learns the XOR within {steps} steps at this size. "
    return head + details + f"On Shakespeare, dropping the MLP costs {gap:+.3f} nats of validation loss."


def draw(n: dict, s: Size):
    """The XOR stacks' and the Shakespeare models' training losses."""
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for label, r in n["xor"].items():
        ax1.plot(r["train_loss"], lw=0.8, label=label)
    ax1.axhline(n["chance_loss"], color="gray", lw=0.8, ls="--", label="chance (ln 2)")
    ax1.set(xlabel="step", ylabel="loss", yscale="log", title="XOR of a token's own features")
    for k, r in n["shakespeare"].items():
        ax2.plot(r["train_loss"], lw=0.8, label=k)
    ax2.set(xlabel="step", ylabel="training loss", title="Shakespeare")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def run(quick: bool, seed: int) -> Result:
    size = SIZES[quick]
    n = measure(size, seed)
    return Result(NAME, CLAIM, tables(n, size), verdict(n, size), n, {"mixing": draw(n, size)})
