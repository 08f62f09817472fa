"""Exercises of "LayerNorm: keeping the stream well-behaved": LayerNorm and RMSNorm, checked against
lumen.block's on random shapes, gains and biases, and at the scale where eps matters."""

from __future__ import annotations

import math
from types import ModuleType

import torch
import torch.nn as nn

from ..block import LayerNorm, RMSNorm
from .exercise import Check, Context, Exercise, Hint, Mistake, Spec
from .probes import differs, expect_close, part, randn, tensor

SECTION = "LayerNorm: keeping the stream well-behaved"


def _is_shape_error(e: RuntimeError) -> bool:
    return "must match the size" in str(e) or "size of tensor" in str(e)


def _shapes(cls: str, d: int = 5):
    def check(m: ModuleType, ctx: Context) -> None:
        norm = getattr(m, cls)(d)
        x = randn(2, 3, d)
        try:
            y = tensor(norm(x), f"{cls}(x)", "keepdim")
        except RuntimeError as e:
            if _is_shape_error(e):
                raise Mistake(f"on an input of shape (2, 3, {d}) it raised: {' '.join(str(e).split())}",
                              "keepdim") from None
            raise
        if y.shape != x.shape:
            raise Mistake(f"an input of shape (2, 3, {d}) came out as {tuple(y.shape)}", "keepdim")
    return check


def _per_token(cls: str, d: int = 6):
    """Change one token and watch another: a norm's statistics belong to each token alone."""
    def check(m: ModuleType, ctx: Context) -> None:
        norm = getattr(m, cls)(d)
        x = randn(3, 4, d, scale=2.0) + 0.5
        y = tensor(norm(x), f"{cls}(x)")
        for (b, t), where, hint in (((1, 0), "token 0 of another sequence in the batch", "batch"),
                                    ((0, 1), "token 1 of the same sequence", "positions")):
            x2 = x.clone()
            x2[b, t] = randn(d, scale=5.0) + 3.0
            if differs(tensor(norm(x2), f"{cls}(x)")[0, 0], y[0, 0], rtol=1e-6, atol=1e-6):
                raise Mistake(f"changing {where} changed the output of token 0 of sequence 0", hint)
    return check


def _set_gain(norm: nn.Module, ref: LayerNorm | RMSNorm, bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random gain (and bias) in the learner's norm and lumen's."""
    d = ref.g.numel()
    g, b = torch.rand(d) + 0.5, torch.randn(d) if bias else torch.zeros(d)
    with torch.no_grad():
        for module in (norm, ref):
            params = dict(module.named_parameters())
            params["g"].copy_(g)
            if bias:
                params["b"].copy_(b)
    return g, b


# -- LayerNorm ---------------------------------------------------------------------------------------------

def _ln_interface(m: ModuleType, ctx: Context) -> None:
    ln = m.LayerNorm(6)
    g, b = part(ln, "g", "interface"), part(ln, "b", "interface")
    if not (isinstance(g, nn.Parameter) and isinstance(b, nn.Parameter)):
        raise Mistake("g and b must be nn.Parameter, so that training learns them", "interface")
    if g.shape != (6,) or b.shape != (6,) or not torch.equal(g.detach(), torch.ones(6)) \
            or not torch.equal(b.detach(), torch.zeros(6)):
        raise Mistake(f"LayerNorm(6) starts with g of shape {tuple(g.shape)} and b of shape {tuple(b.shape)}; "
                      "expected g = ones(6), b = zeros(6)", "interface")
    m.LayerNorm(6, eps=1e-3)


def _ln_values(m: ModuleType, ctx: Context) -> None:
    for shape in ((7,), (3, 9), (2, 5, 16)):
        d = shape[-1]
        ln, ref = m.LayerNorm(d), LayerNorm(d)
        g, b = _set_gain(ln, ref, bias=True)
        x = randn(*shape, scale=2.0) + 0.5
        y, want = tensor(ln(x), "LayerNorm(x)"), ref(x).detach()
        if not differs(y, want):
            continue
        if y.shape == want.shape:
            z, z_ref = (y.detach() - b) / g, (want - b) / g
            big = z_ref.abs() > 0.1
            ratio = z[big] / z_ref[big]
            if torch.allclose(ratio, torch.full_like(ratio, math.sqrt((d - 1) / d)), atol=1e-3):
                raise Mistake(f"for d = {d} every output is sqrt((d-1)/d) = {math.sqrt((d - 1) / d):.4f} times "
                              "lumen's: the variance divides by d - 1", "unbiased")
            if not differs(y, z_ref):
                raise Mistake("the output is the standardised x, without g and b applied", "gain")
        expect_close(y, want, f"LayerNorm(x) for x of shape {shape}")


def _ln_eps(m: ModuleType, ctx: Context) -> None:
    for eps in (1e-5, 1e-2):
        ln, ref = (m.LayerNorm(8), LayerNorm(8)) if eps == 1e-5 else (m.LayerNorm(8, eps=eps), LayerNorm(8, eps))
        x = randn(4, 8, scale=math.sqrt(eps))   # a variance about eps: where eps changes the answer
        y, want = tensor(ln(x), "LayerNorm(x)"), ref(x).detach()
        if differs(y, want, rtol=1e-3, atol=1e-4):
            ratio = (y.detach().std() / want.std()).item()
            raise Mistake(f"with eps = {eps:g}, on inputs whose variance is about eps, the output is {ratio:.3f} "
                          "times the size of lumen's", "eps")


LAYERNORM = Exercise(
    name="layernorm",
    section=SECTION,
    title="LayerNorm from its formula, with the chapter's g and b",
    task="""\
Write LayerNorm as the chapter does: standardise each token's vector on its own, then apply a learned
per-dimension gain g (gamma) and bias b (beta):

    LN(x) = (x - mean) / sqrt(var + eps) * g + b

mean and var are taken over the last axis (the d dimensions of one token), var dividing by d. x has any
leading shape (..., d): a (B, L, d) tensor is B x L independent normalisations.""",
    template='''\
import torch
import torch.nn as nn


class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        # self.g: the gain, a parameter of d ones; self.b: the bias, d zeros; self.eps
        raise NotImplementedError

    def forward(self, x):                        # x: (..., d)
        raise NotImplementedError
''',
    specs=(Spec("LayerNorm", "class",
                "class LayerNorm(nn.Module) with __init__(self, d, eps=1e-5) and forward(self, x)",
                args=(8,), kwargs={"eps": 1e-5}, forward_args=("x",)),),
    checks=(
        Check("the chapter's interface: LayerNorm(d, eps=1e-5), g = ones(d) and b = zeros(d) as parameters",
              _ln_interface),
        Check("the output has the input's shape (B, T, d)", _shapes("LayerNorm")),
        Check("statistics per token: one token's output depends on that token alone", _per_token("LayerNorm")),
        Check("equal to lumen's LayerNorm on random inputs, shapes, gains and biases", _ln_values),
        Check("eps where the formula puts it, on inputs whose variance is about eps", _ln_eps),
    ),
    hints={
        "task": "Per token: subtract the mean over the last axis, divide by the square root of the variance (dividing "
                "by d) plus eps, then scale by g and shift by b.",
        "interface": Hint(
            "the names your __init__ gives the gain and the bias, what they start as, and whether the module "
            "counts them as its parameters (print dict(LayerNorm(6).named_parameters())).",
            "LN(x) = (x - mean) / sqrt(var + eps) * g + b: g and b are learned per dimension, so parameters of "
            "d values each, starting where LN changes nothing (g = 1, b = 0).",
            "Use the chapter's names: self.g = nn.Parameter(torch.ones(d)) and self.b = nn.Parameter(torch.zeros(d)) "
            "(not weight/bias or gamma/beta), and keep eps."),
        "keepdim": Hint(
            "the shapes of your mean and variance for x of shape (2, 3, 5): print them.",
            "mean and var are one number per token, shape (2, 3, 1): a length-1 last axis broadcasts against x "
            "of shape (2, 3, 5); shape (2, 3) does not.",
            "Reduce with keepdim=True (x.mean(-1, keepdim=True)): the statistics keep a length-1 last axis, so they "
            "broadcast back against x of shape (..., d)."),
        "batch": Hint(
            "the axis your mean and variance are taken over.",
            "the statistics are over the d dimensions of one token, the last axis (-1): one mean and one variance "
            "per token.",
            "The statistics are over the last axis only (-1), not over the batch: the chapter takes them across the "
            "d dimensions of one token, which is why LayerNorm works for a batch of one."),
        "positions": Hint(
            "the axis your mean and variance are taken over.",
            "the statistics are over the d dimensions of one token, the last axis (-1), never over the sequence.",
            "The statistics are over the last axis (-1), not over positions (-2): each token is normalised on its "
            "own, whatever the length of the sequence."),
        "unbiased": Hint(
            "your variance: what the sum of squared deviations is divided by.",
            "var = mean((x - mean)^2) over the last axis: the sum divided by d, as nn.LayerNorm does.",
            "Divide the variance by d, not d - 1: x.var(-1, keepdim=True, unbiased=False) (torch's var is unbiased "
            "by default; the formula and nn.LayerNorm are not)."),
        "gain": Hint(
            "the end of your forward: what happens after x is standardised.",
            "LN(x) = standardised x * g + b: the gain and the bias apply last, per dimension.",
            "After standardising, multiply by self.g and add self.b: they let the network undo the normalisation "
            "where it prefers to."),
        "eps": Hint(
            "where eps enters your formula, and which eps it is.",
            "(x - mean) / sqrt(var + eps): eps inside the square root, the one given to __init__.",
            "eps goes inside the square root, torch.sqrt(var + self.eps), and it is the eps given to __init__: "
            "(x - mu) / (std + eps) or a fixed 1e-5 differ exactly when the variance is small."),
    },
    solution=("lumen.block.LayerNorm",),
)


# -- RMSNorm -----------------------------------------------------------------------------------------------

def _rms_interface(m: ModuleType, ctx: Context) -> None:
    norm = m.RMSNorm(6)
    g = part(norm, "g", "task")
    if not isinstance(g, nn.Parameter) or g.shape != (6,) or not torch.equal(g.detach(), torch.ones(6)):
        raise Mistake("RMSNorm(6) needs g = nn.Parameter(torch.ones(6))")
    extra = [n for n, _ in norm.named_parameters() if n != "g"]
    if extra:
        raise Mistake(f"RMSNorm has parameters besides g: {', '.join(extra)}", "bias")
    m.RMSNorm(6, eps=1e-3)


def _rms_values(m: ModuleType, ctx: Context) -> None:
    for shape in ((7,), (3, 9), (2, 5, 16)):
        d = shape[-1]
        norm, ref = m.RMSNorm(d), RMSNorm(d)
        g, _ = _set_gain(norm, ref, bias=False)
        x = randn(*shape, scale=2.0) + 1.0
        y, want = tensor(norm(x), "RMSNorm(x)"), ref(x).detach()
        if not differs(y, want):
            continue
        if y.shape == want.shape:
            centred = LayerNorm(d, 1e-6)
            with torch.no_grad():
                centred.g.copy_(g)
            if not differs(y, centred(x)):
                raise Mistake("the output is LayerNorm's (the mean subtracted), not RMSNorm's", "centre")
            offset = (y.detach() - want).reshape(-1, d)
            if offset.abs().max() > 1e-3 and not differs(offset, offset[:1].expand_as(offset)):
                raise Mistake("the output is lumen's plus the same vector at every token: a bias", "bias")
        expect_close(y, want, f"RMSNorm(x) for x of shape {shape}")


def _rms_chapter(m: ModuleType, ctx: Context) -> None:
    y = tensor(m.RMSNorm(4)(torch.tensor([2.0, 4.0, 6.0, 8.0])), "RMSNorm(4)([2, 4, 6, 8])")
    chapter = torch.tensor([0.37, 0.73, 1.10, 1.46])
    if differs(y, chapter, rtol=0, atol=0.005):
        raise Mistake(f"RMSNorm(4)([2, 4, 6, 8]) = {[round(v, 3) for v in y.tolist()]}; the chapter: "
                      "[0.37, 0.73, 1.10, 1.46]")


def _rms_eps(m: ModuleType, ctx: Context) -> None:
    for eps in (1e-6, 1e-2):
        norm, ref = (m.RMSNorm(8), RMSNorm(8)) if eps == 1e-6 else (m.RMSNorm(8, eps=eps), RMSNorm(8, eps))
        x = randn(4, 8, scale=math.sqrt(eps))
        y, want = tensor(norm(x), "RMSNorm(x)"), ref(x).detach()
        if differs(y, want, rtol=1e-3, atol=1e-4):
            ratio = (y.detach().pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
            raise Mistake(f"with eps = {eps:g}, on inputs whose mean square is about eps, the output is "
                          f"{ratio:.3f} times the size of lumen's", "eps")


RMSNORM = Exercise(
    name="rmsnorm",
    section=SECTION,
    title="RMSNorm: LayerNorm without the mean and the bias ([2,4,6,8] -> [0.37, 0.73, 1.10, 1.46])",
    task="""\
Write RMSNorm (Zhang and Sennrich 2019) as the chapter does: divide each token's vector by its root mean
square and apply a learned per-dimension gain g; no mean subtraction, no bias:

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g           mean over the last axis

On the chapter's example, [2, 4, 6, 8] -> [0.37, 0.73, 1.10, 1.46].""",
    template='''\
import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        # self.g: the gain, a parameter of d ones; self.eps
        raise NotImplementedError

    def forward(self, x):                        # x: (..., d)
        raise NotImplementedError
''',
    specs=(Spec("RMSNorm", "class", "class RMSNorm(nn.Module) with __init__(self, d, eps=1e-6) and forward(self, x)",
                args=(8,), kwargs={"eps": 1e-6}, forward_args=("x",)),),
    checks=(
        Check("the chapter's interface: RMSNorm(d, eps=1e-6) with one parameter, g = ones(d)", _rms_interface),
        Check("the output has the input's shape (B, T, d)", _shapes("RMSNorm")),
        Check("statistics per token: one token's output depends on that token alone", _per_token("RMSNorm")),
        Check("equal to lumen's RMSNorm on random inputs, shapes and gains", _rms_values),
        Check("the chapter's example: [2, 4, 6, 8] -> [0.37, 0.73, 1.10, 1.46]", _rms_chapter),
        Check("eps inside the square root, on inputs whose mean square is about eps", _rms_eps),
    ),
    hints={
        "task": "Divide x by the square root of its mean square over the last axis plus eps, then scale by g: no "
                "mean, no bias.",
        "keepdim": Hint(
            "the shape of your root mean square for x of shape (2, 3, 5): print it.",
            "one root mean square per token, shape (2, 3, 1): a length-1 last axis broadcasts against x.",
            "Reduce with keepdim=True so the root mean square broadcasts back against x of shape (..., d)."),
        "batch": Hint(
            "the axis your mean square is taken over.",
            "RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g, the mean over the d dimensions of one token (axis -1).",
            "The mean square is over the last axis only (-1): each token is scaled on its own, never by the other "
            "sequences in the batch."),
        "positions": Hint(
            "the axis your mean square is taken over.",
            "the mean over the d dimensions of one token (axis -1), never over the sequence.",
            "The mean square is over the last axis (-1), not over positions (-2)."),
        "centre": Hint(
            "what you divide by the root mean square: x, or something computed from it first.",
            "RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g: x itself is scaled; nothing is subtracted.",
            "RMSNorm drops LayerNorm's mean subtraction: divide x itself (not x - mean) by its root mean square."),
        "bias": Hint(
            "the parameters your __init__ creates, and what forward adds at the end.",
            "RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g: one learned vector, the gain.",
            "RMSNorm drops the bias too: its only parameter is the gain g; do not add a b."),
        "eps": Hint(
            "where eps enters your formula, and which eps it is.",
            "x / sqrt(mean(x^2) + eps): eps inside the square root, the one given to __init__.",
            "eps goes inside the square root, torch.sqrt(mean(x^2) + self.eps), and is the eps given to __init__."),
    },
    solution=("lumen.block.RMSNorm",),
)
