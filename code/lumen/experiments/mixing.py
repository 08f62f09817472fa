"""Experiment `mixing`: attention mixes, the MLP computes. A task that needs a new nonlinear feature of each
token (the XOR of two of its own binary features) for an attention-only stack and for full blocks; and the
validation-loss gap of attention-only against full blocks on Shakespeare."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..model import GPT
from .fit import History, fit, shakespeare, train_lm
from .result import Result, Table, figure
from .stacks import build

NAME = "mixing"
CLAIM = ("Attention outputs are convex combinations of value vectors: mixing is not thinking. A new nonlinear feature "
         "of a token (here: the XOR of two of its features) is out of reach for attention alone and easy with the MLP.")

SIZES: dict[bool, dict[str, Any]] = {
    False: dict(features=4, context=16, d=64, layers=2, steps=400, batch=32, lm_layers=4, lm_d=96, lm_steps=300,
                lm_batch=16, eval_windows=64),
    True: dict(features=4, context=16, d=32, layers=2, steps=100, batch=16, lm_layers=2, lm_d=32, lm_steps=30,
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

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, 2**self.features, (n, self.context), generator=self.gen)
        return x, self.answer[x]

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
        x, y = self.batch(n)
        logits, loss = model(x, y)
        return loss.item(), (logits.argmax(-1) == y).float().mean().item()


def steps_to(hist: History, loss: float, window: int = 10) -> int | None:
    """The first step at which the mean training loss over `window` steps falls below `loss`."""
    for i in range(window, len(hist.loss) + 1):
        if sum(hist.loss[i - window:i]) / window < loss:
            return i
    return None


def run(quick: bool, seed: int) -> Result:
    s = SIZES[quick]
    task = OwnFeatureXor(s["features"], s["d"], s["context"], seed)
    base = ModelConfig(d_model=s["d"], n_layers=s["layers"], n_heads=4, activation="gelu")
    variants = {  # label -> (kind, layers)
        f"full blocks, {s['layers']} layers": ("residual", s["layers"]),
        f"attention-only, {s['layers']} layers": ("attention-only", s["layers"]),
        f"attention-only, {3 * s['layers']} layers (same parameters)": ("attention-only", 3 * s["layers"]),
    }
    synth, params = {}, {}
    for label, (kind, layers) in variants.items():
        torch.manual_seed(seed)
        model = task.model(base.replace(n_layers=layers), kind)
        params[label] = sum(p.numel() for p in model.blocks.parameters())
        hist = fit(model, lambda step: task.batch(s["batch"]), s["steps"], lr=1e-2, warmup=s["steps"] // 10)
        synth[label] = (hist, *task.evaluate(model))
    chance = F.cross_entropy(torch.zeros(1, 2), torch.tensor([0])).item()   # ln 2: guessing

    data = shakespeare()
    lm_cfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=64, d_model=s["lm_d"],
                         n_layers=s["lm_layers"], n_heads=4, activation="gelu")
    lm = {}
    for kind in ("residual", "attention-only"):
        torch.manual_seed(seed)
        lm[kind] = train_lm(build(lm_cfg, kind), data, s["lm_steps"], lr=2e-3, warmup=s["lm_steps"] // 10,
                            batch_size=s["lm_batch"], seed=seed, eval_windows=s["eval_windows"])

    t1 = Table(f"XOR of two of a token's own features, {s['steps']} steps, d={s['d']} (chance: loss ln 2 = "
               f"{chance:.3f}, accuracy 0.5)",
               ["stack", "block parameters", "loss", "accuracy", "steps to loss < 0.1"],
               [[label, params[label], loss, acc, steps_to(h, 0.1) or f"not in {s['steps']}"]
                for label, (h, loss, acc) in synth.items()])
    t2 = Table(f"Shakespeare (characters), {s['lm_layers']} layers, d={s['lm_d']}, {s['lm_steps']} steps",
               ["stack", "train loss", "val loss"],
               [[k, h.final_loss, h.final_val] for k, h in lm.items()])
    full, attn, attn3 = (synth[k] for k in variants)
    gap = lm["attention-only"].final_val - lm["residual"].final_val
    solved = full[2] > 0.95
    attn_solved = max(attn[2], attn3[2]) > 0.95
    fails = max(attn[2], attn3[2]) < 0.75

    def speed(h):
        n = steps_to(h, 0.1)
        return f"{n} steps" if n else f"not within {s['steps']} steps"

    details = (f"With the MLP: accuracy {full[2]:.3f}, loss {full[1]:.2g}, loss < 0.1 after {speed(full[0])}; "
               f"attention alone: {attn[2]:.3f} (loss {attn[1]:.2g}, {speed(attn[0])}) with the same layers and "
               f"{attn3[2]:.3f} (loss {attn3[1]:.2g}, {speed(attn3[0])}) with three times as many. ")
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
        head = f"Neither stack learns the XOR within {s['steps']} steps at this size. "
    verdict = head + details + f"On Shakespeare, dropping the MLP costs {gap:+.3f} nats of validation loss."
    fig, (ax1, ax2) = figure(2, 5.5, 4)
    for label, (hist, _, _) in synth.items():
        ax1.plot(hist.loss, lw=0.8, label=label)
    ax1.axhline(chance, color="gray", lw=0.8, ls="--", label="chance (ln 2)")
    ax1.set(xlabel="step", ylabel="loss", yscale="log", title="XOR of a token's own features")
    for k, h in lm.items():
        ax2.plot(h.loss, lw=0.8, label=k)
    ax2.set(xlabel="step", ylabel="training loss", title="Shakespeare")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    numbers = {"xor": {label: {"loss": loss, "accuracy": acc, "block_parameters": params[label],
                           "steps_to_0.1": steps_to(h, 0.1), "train_loss": h.loss}
                   for label, (h, loss, acc) in synth.items()},
               "shakespeare": {k: {"final_loss": h.final_loss, "val": h.final_val} for k, h in lm.items()},
               "chance_loss": chance}
    return Result(NAME, CLAIM, [t1, t2], verdict, numbers, {"mixing": fig})
