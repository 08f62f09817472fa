"""AdamW with weight decay on matrices only, and the learning rate: linear warm-up, then cosine decay.

    >>> lr_at(0, lr=1e-3, min_lr=1e-4, warmup=9, steps=100)   # warm-up: the first step already moves a little
    0.0001
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices (linear weights, embeddings) decay toward zero; vectors (biases, norm gains)
    do not, since shrinking a gain or a bias is not a simpler model, only a differently scaled one."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied matrix appears once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    """AdamW over the model's parameters; the fused kernel (one pass over all tensors) on CPU and CUDA."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, fused=True)


def lr_at(step: int, lr: float, min_lr: float, warmup: int, steps: int) -> float:
    """The learning rate at optimizer step `step` (0-based): a linear ramp over `warmup` steps to lr,
    then half a cosine from lr down to min_lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if steps <= warmup + 1:
        return lr
    progress = min(1.0, (step - warmup) / (steps - 1 - warmup))  # 0 at the end of warm-up, 1 at the end
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def clip_and_step(opt: torch.optim.Optimizer, model: nn.Module, grad_clip: float) -> float:
    """Clip the gradients to a global norm of grad_clip (0: no clipping) and take the optimizer step, unless
    the norm is NaN or inf (then nothing moves). Returns the norm before clipping."""
    gnorm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf).item()
    if math.isfinite(gnorm):
        opt.step()
    opt.zero_grad(set_to_none=True)
    return gnorm
