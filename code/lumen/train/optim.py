"""The optimizers and the learning rate.

AdamW with weight decay on matrices only; or Muon for the blocks' matrices beside AdamW for the rest. The
rate: a linear warm-up, then a cosine down to min_lr, or warm-up, stable, decay (a flat rate, then a straight
line down to min_lr over the last `decay` of the steps).

    >>> lr_at(0, lr=1e-3, min_lr=1e-4, warmup=9, steps=100)   # warm-up: the first step already moves a little
    0.0001
    >>> lr_at(50, lr=1e-3, min_lr=1e-4, warmup=9, steps=100, schedule="wsd", decay=0.2)   # the stable part
    0.001
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ..runtime import cpu

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """decay_groups of the model's trainable parameters (a tied matrix appears once)."""
    return decay_groups([p for p in model.parameters() if p.requires_grad], weight_decay)


def decay_groups(params: list[nn.Parameter], weight_decay: float) -> list[dict]:
    """Two groups: matrices (linear weights, embeddings) decay toward zero; vectors (biases, norm gains)
    do not, since shrinking a gain or a bias is not a simpler model, only a differently scaled one."""
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


class MuonAdamW:
    """Muon for the blocks' matrices, AdamW for the embeddings and the vectors.

    Muon replaces a matrix's momentum by the nearest orthogonal matrix (Newton-Schulz iterations): every
    direction the update moves in moves by the same amount, so no few directions of a small gradient drown
    out the rest. It is made for the hidden layers' matrices; an embedding is a lookup table (a row per token,
    not a map between spaces) and stays with AdamW. The two share one schedule: each group's rate is the
    schedule's times its `lr_scale` (muon_lr / lr for Muon's)."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"muon", "adamw"}:  # (the caller names the checkpoint)
            raise KeyError("it was written by another optimizer than optimizer = \"muon\"")
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


class StackedMuon(torch.optim.Muon):
    """torch.optim.Muon's update, with one Newton-Schulz iteration over each stack of same-shape matrices.

    A small model's matrices are small (16 of 128 x 128 here): one matrix product each leaves most of a core
    idle between them, so the same products run as one batched product per shape. The update is the one
    torch.optim.Muon defines (its momentum, its Newton-Schulz polynomial in bfloat16, its decoupled weight
    decay and its "original" scale, sqrt(rows / columns) for a tall matrix), and its state is the same
    momentum_buffer per matrix, so the two read each other's checkpoints."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["adjust_lr_fn"] not in (None, "original"):
                raise ValueError("StackedMuon takes the original scale only (adjust_lr_fn = \"original\")")
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            bufs = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
            mu, lr = group["momentum"], group["lr"]
            torch._foreach_lerp_(bufs, grads, 1 - mu)  # the momentum: an average of the recent gradients
            updates = torch._foreach_lerp(grads, bufs, mu) if group["nesterov"] else bufs
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for i, p in enumerate(params):
                by_shape[tuple(p.shape)].append(i)
            for (rows, cols), same in by_shape.items():
                stack = orthogonalize(torch.stack([updates[i] for i in same]), group["ns_coefficients"],
                                      group["ns_steps"], group["eps"])
                torch._foreach_add_([params[i] for i in same], list(stack.unbind(0)),
                                    alpha=-lr * math.sqrt(max(1, rows / cols)))
        return loss


def orthogonalize(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, bf16_products: bool | None = None) -> torch.Tensor:
    """Newton-Schulz on a stack of matrices (n, rows, cols): each scaled to a norm of 1 (so no singular
    value exceeds 1), then `steps` times X <- aX + (bA + cA^2)X with A = XX^T, a polynomial that pushes every
    singular value toward 1 and leaves the singular vectors: nearly the orthogonal matrix nearest to each.

    In bfloat16, as torch.optim.Muon defines it. bf16_products: whether the products run as bf16 products
    (default: where they are fast, a GPU or a CPU with oneDNN's bf16 kernels); otherwise the same bf16 numbers
    multiply in float32 and each result is rounded to bf16, as a bf16 product's is (its sums are float32 too).
    On a CPU without those kernels (an AVX2-only x86) torch's bf16 product is a plain loop, ~150x slower."""
    if bf16_products is None:
        bf16_products = g.device.type != "cpu" or cpu.onednn_bf16()
    work = torch.bfloat16 if bf16_products else torch.float32

    def bf16(t: torch.Tensor) -> torch.Tensor:  # the numbers bf16 holds, in the dtype the products run in
        return t.bfloat16().to(work)

    a, b, c = coefficients
    x = bf16(g)
    tall = g.size(-2) > g.size(-1)
    if tall:  # the wide side: A = XX^T is the smaller square
        x = x.mT
    x = bf16(x / bf16(torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)).clamp(min=eps))
    for _ in range(steps):
        gram = bf16(x @ x.mT)
        x = bf16(torch.baddbmm(x, bf16(torch.baddbmm(gram, gram, gram, beta=b, alpha=c)), x, beta=a))
    x = x.bfloat16()
    return x.mT if tall else x


Optimizer = torch.optim.Optimizer | MuonAdamW


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                   kind: str = "adamw", muon_lr: float = 0.02, momentum: float = 0.95,
                   ns_steps: int = 5) -> Optimizer:
    """AdamW over the model's parameters (the fused kernel: one pass over all tensors, on CPU and CUDA); or,
    for kind = "muon", Muon at muon_lr over the 2-D weights inside the blocks (ns_steps Newton-Schulz
    iterations a step, over each stack of same-shape matrices at once: StackedMuon) and AdamW over the rest."""
    if kind == "adamw":
        return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, fused=True)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = [p for n, p in named if p.dim() == 2 and n.startswith("blocks.")]
    if not hidden:
        raise ValueError("optimizer = \"muon\" needs a model with blocks of 2-D weights")
    taken = {id(p) for p in hidden}
    rest = [p for _, p in named if id(p) not in taken]
    adamw = torch.optim.AdamW(decay_groups(rest, weight_decay), lr=lr, betas=betas, fused=True)
    # the original scale (sqrt of a tall matrix's aspect; "match_rms_adamw" would reuse AdamW's rate) keeps
    # muon_lr the number the Muon literature tunes; weight decay shrinks each matrix per step as AdamW's
    # matrices shrink (1 - lr x weight_decay)
    muon = StackedMuon(hidden, lr=muon_lr, weight_decay=weight_decay * lr / muon_lr, momentum=momentum,
                       nesterov=True, ns_steps=ns_steps, adjust_lr_fn="original")
    for group in muon.param_groups:
        group["lr_scale"] = muon_lr / lr
    return MuonAdamW(muon, adamw)


def lr_at(step: int, lr: float, min_lr: float, warmup: int, steps: int, schedule: str = "cosine",
          decay: float = 0.3) -> float:
    """The learning rate at optimizer step `step` (0-based): a linear ramp over `warmup` steps to lr, then
    (cosine) half a cosine from lr down to min_lr at the last step, or (wsd) lr until the last `decay`
    fraction of the steps and a straight line from lr to min_lr over them."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if steps <= warmup + 1:
        return lr
    if schedule == "wsd":
        cooldown = max(1, round(decay * (steps - warmup)))  # the last `cooldown` steps go down
        left = steps - 1 - step  # steps after this one
        return lr if left >= cooldown else min_lr + (lr - min_lr) * left / cooldown
    progress = min(1.0, (step - warmup) / (steps - 1 - warmup))  # 0 at the end of warm-up, 1 at the end
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)


def set_lr(opt: Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def clip_and_step(opt: Optimizer, model: nn.Module, grad_clip: float) -> float:
    """Clip the gradients to a global norm of grad_clip (0: no clipping) and take the optimizer step, unless
    the norm is NaN or inf (then nothing moves). Returns the norm before clipping."""
    gnorm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf).item()
    if math.isfinite(gnorm):
        opt.step()
    opt.zero_grad(set_to_none=True)
    return gnorm
