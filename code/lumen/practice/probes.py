"""What the checks share: random inputs, comparisons that say what differed, the affine map inside any
module (so a solution with its own layout of weights is checked as well as one with nn.Linear), and small
random models of lumen's families for the looking-inside exercises.
"""

from __future__ import annotations

import math
import numbers
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..model import GPT
from .exercise import Mistake


def randn(*shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype) * scale


def tensor(value: Any, what: str, hint: str = "task") -> torch.Tensor:
    """value itself if it is a tensor, else a Mistake saying what came back."""
    if not isinstance(value, torch.Tensor):
        raise Mistake(f"{what} returned {type(value).__name__}, not a torch.Tensor", hint)
    return value


def differs(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    """True unless got has want's shape and equals it within the tolerances."""
    if got.shape != want.shape:
        return True
    return not torch.allclose(got.detach().double(), want.detach().double(), rtol=rtol, atol=atol)


def expect_close(got: Any, want: torch.Tensor, what: str, hint: str = "task", rtol: float = 1e-4,
                 atol: float = 1e-5) -> None:
    """A Mistake naming the shapes or the largest difference unless got equals want within the tolerances."""
    got = tensor(got, what, hint)
    if got.shape != want.shape:
        raise Mistake(f"{what} has shape {tuple(got.shape)}; expected {tuple(want.shape)}", hint)
    if differs(got, want, rtol, atol):
        diff = (got.detach().double() - want.detach().double()).abs()
        raise Mistake(f"{what} differs from lumen's by up to {diff.max().item():.3g} "
                      f"(tolerance {atol:g} + {rtol:g} x |lumen's|)", hint)


def part(obj: Any, name: str, hint: str = "task") -> Any:
    """obj.name, which the exercise asks for (a Mistake if it is missing)."""
    if not hasattr(obj, name):
        raise Mistake(f"{type(obj).__name__} has no attribute {name!r} (the chapter's names are asked for)", hint)
    return getattr(obj, name)


@torch.no_grad()
def randomise(module: nn.Module, std: float = 0.5) -> None:
    """Every parameter drawn afresh from N(0, std^2): a check must not pass because weights are zeros or ones."""
    for p in module.parameters():
        p.normal_(0.0, std)


@torch.no_grad()
def affine(fn: Any, d_in: int, what: str, hint: str = "task") -> tuple[torch.Tensor, torch.Tensor]:
    """(A, c) with fn(x) = x @ A + c for x of shape (..., d_in), read off fn itself: c = fn(0) and A's rows
    are fn(e_i) - c; then checked on random inputs (a Mistake if fn is not affine)."""
    if not callable(fn):
        raise Mistake(f"{what} is a {type(fn).__name__}, not something that maps a vector to a vector", hint)
    c = tensor(fn(torch.zeros(1, d_in)), what, hint)
    if c.dim() != 2 or c.size(0) != 1:
        raise Mistake(f"{what} maps a (1, {d_in}) input to shape {tuple(c.shape)}", hint)
    A = tensor(fn(torch.eye(d_in)), what, hint) - c
    x = randn(3, 5, d_in)
    out = tensor(fn(x), what, hint)
    if differs(out, x @ A + c[0], rtol=1e-4, atol=1e-4):
        raise Mistake(f"{what} is not an affine map x -> x W + b of its input", hint)
    return A, c[0]


@torch.no_grad()
def set_linear(lin: nn.Linear, A: torch.Tensor, c: torch.Tensor | None) -> nn.Linear:
    """lin holding the map x -> x A + c (nn.Linear stores A transposed)."""
    lin.weight.copy_(A.T)
    if lin.bias is not None:
        lin.bias.copy_(c if c is not None else torch.zeros_like(lin.bias))
    return lin


def number(module: ModuleType, name: str, hint: str = "task") -> float:
    """The number the learner filled in for `name` (a Mistake while it is still `...`)."""
    value = getattr(module, name)
    if value is ... or value is None:
        raise Mistake(f"{name} is not answered yet (it is still {value!r})", "task")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise Mistake(f"{name} = {value!r} is not a finite number", hint)
    return float(value)


def near(value: float, target: float, rel: float) -> bool:
    return abs(value - target) <= rel * abs(target)


TINY = {
    "a GPT-2-style model (LayerNorm, GELU MLP, learned positions, biases)":
        ModelConfig(vocab_size=61, context=16, d_model=32, n_layers=3, n_heads=4, activation="gelu"),
    "a Llama-style model (RMSNorm, SwiGLU, RoPE, 2 KV heads)":
        ModelConfig(vocab_size=53, context=16, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, mlp="swiglu",
                    d_ff=80, activation="silu", norm="rmsnorm", norm_eps=1e-6, positions="rope", bias=False),
}


@torch.no_grad()
def tiny_models(seed: int = 0, kinds: tuple[str, ...] = ("gpt2", "llama")) -> list[tuple[str, GPT]]:
    """Small random models of two families, in eval mode, with every norm's gain (and bias) drawn at random
    as a trained model's are: reading the stream without the final norm then gives other tokens."""
    out = []
    for (what, cfg), kind in zip(TINY.items(), ("gpt2", "llama")):
        if kind not in kinds:
            continue
        torch.manual_seed(seed)
        model = GPT(cfg).eval()
        for name, p in model.named_parameters():
            if name.endswith(".g"):
                p.uniform_(0.2, 3.0)
            elif name.endswith(".b") and p.dim() == 1 and "ln" in name:
                p.normal_(0.0, 1.0)
            elif p.dim() == 2:
                p.mul_(20.0)   # weights of a trained model's size: the blocks' writes matter
        out.append((what, model))
    return out


def token_ids(model: GPT, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, model.cfg.vocab_size, (batch, length))


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every tensor of the model (to see whether a function left it as it found it)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
