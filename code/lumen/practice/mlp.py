"""Exercises of "The problem: mixing is not thinking" and "The feed-forward block (MLP)": what attention
can reach, the MLP, the chapter's worked example, GELU from its formula, SwiGLU; checked against
lumen.attention, lumen.block and lumen.accounting."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn as nn

from ..accounting import formula
from ..attention import MultiHeadAttention
from ..block import MLP, GeGLU, SwiGLU
from ..config import ACTIVATIONS, ModelConfig
from .exercise import Check, Context, Exercise, Hint, Mistake, Spec
from .probes import affine, differs, expect_close, part, randn, randomise, set_linear, tensor

FFN = "The feed-forward block (MLP)"

# The worked example's matrices. The chapter's text states x = [1, -1], the pre-activations x W1 = [1, -1, -2, 0],
# the hidden activation [0.84, -0.16, -0.05, 0] and the result [1.79, -1.21], but not W1 and W2 themselves
# (the equations are missing from the text): these are a reconstruction consistent with every stated number
# (docs/confusions.md says how it was found, and that it is one).
WORKED_X = (1.0, -1.0)
WORKED_W1 = ((1.0, 0.0, -1.0, 1.0), (0.0, 1.0, 1.0, 1.0))   # d x 4: column j is unit j's key
WORKED_W2 = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.0, 0.0))  # 4 x d: row j is what unit j writes
WORKED_ROUNDED = (1.79, -1.21)   # the chapter's figure: h rounded to two decimals before projecting back


def worked_mlp(x: torch.Tensor, W1: torch.Tensor, W2: torch.Tensor) -> MLP:
    """lumen's MLP (exact GELU, no biases) holding the map h = GELU(x W1), write = h W2."""
    mlp = MLP(W1.size(0), W1.size(1), activation="gelu", bias=False)
    set_linear(mlp.fc, W1, None), set_linear(mlp.proj, W2, None)
    return mlp


def worked_result() -> list[float]:
    """The stream after the MLP for the chapter's x, computed exactly by lumen's MLP: [1.796, -1.204]."""
    x = torch.tensor(WORKED_X, dtype=torch.float64)
    mlp = worked_mlp(x, torch.tensor(WORKED_W1), torch.tensor(WORKED_W2)).double()
    return (x + mlp(x)).tolist()


# -- mixing ------------------------------------------------------------------------------------------------

def _mix_contains(m: ModuleType, ctx: Context) -> None:
    T, d = 7, 5
    values = randn(T, d, scale=2.0)
    out = m.reachable_range(values.clone())
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise Mistake("reachable_range should return two tensors, (low, high)")
    low, high = (tensor(v, "reachable_range(values)") for v in out)
    if low.shape != (d,) or high.shape != (d,):
        raise Mistake(f"for values of shape ({T}, {d}) low and high have shapes {tuple(low.shape)} and "
                      f"{tuple(high.shape)}; expected ({d},) each: one bound per coordinate", "axis")
    attn = MultiHeadAttention(d, 1)
    q, k = randn(1, 1, T, d, scale=3.0), randn(1, 1, T, d, scale=3.0)
    outputs = attn.attend_plain(q, k, values[None, None], None)[0, 0].detach()   # (T, d): every query's average
    outside = (outputs < low - 1e-5) | (outputs > high + 1e-5)
    if outside.any():
        raise Mistake(f"lumen's attention over these values produced {int(outside.sum())} coordinates outside "
                      "[low, high]", "extremes")


def _mix_tight(m: ModuleType, ctx: Context) -> None:
    values = randn(6, 4)
    low, high = m.reachable_range(values.clone())
    # one-hot weights are convex too: each token's own value is an output attention can give
    reached_low, reached_high = values.min(0).values, values.max(0).values
    if differs(tensor(low, "low"), reached_low) or differs(tensor(high, "high"), reached_high):
        raise Mistake("attention putting all its weight on one token reaches coordinates your range does not "
                      "end at: it is wider than what can be reached", "tight")


MIXING = Exercise(
    name="mixing",
    section="The problem: mixing is not thinking",
    title="what an attention head can output: the range of a convex combination",
    task="""\
An attention head's output for token i is sum_j a_ij v_j, with weights a_ij >= 0 that sum to one: a convex
combination of the value vectors. Write reachable_range(values): for the values of a sequence, shape
(T, d), return (low, high), each of shape (d,): the smallest and the largest value each coordinate of a
head's output can take, over every possible choice of attention weights. (Whatever is outside that range,
attention alone cannot produce: mixing is not thinking.)""",
    template='''\
import torch


def reachable_range(values):
    """values: (T, d). Returns (low, high), each (d,)."""
    raise NotImplementedError
''',
    specs=(Spec("reachable_range", "function", "def reachable_range(values) returning (low, high)",
                args=(torch.zeros(2, 2),)),),
    checks=(
        Check("every output of lumen's attention over the values lies in [low, high]", _mix_contains),
        Check("the range is tight: attention can reach both ends", _mix_tight),
    ),
    hints={
        "task": "Attention may put all its weight on a single token, and a mix of values never leaves their per- "
                "coordinate range: the answer is a reduction over the tokens, one bound per coordinate.",
        "axis": Hint(
            "the axis your min and max reduce over, and the shape of what they give for values of shape (T, d).",
            "An attention head's output for token i is sum_j a_ij v_j, a convex combination of the value vectors:"
            " weights non-negative, summing to one, one weight per token j.",
            "One bound per coordinate: reduce over the tokens (axis 0 of (T, d)), not over the d coordinates."),
        "extremes": Hint(
            "what your bounds are built from: the mean of the values, or the values themselves.",
            "sum_j a_ij v_j with a_ij >= 0 and sum_j a_ij = 1: whatever the head produces lies inside the cloud "
            "of the values already in the sequence, and the weights may sit on any one token.",
            "The mean is one output among many: weights may put everything on the token with the smallest "
                    "(or largest) value of a coordinate."),
        "tight": Hint(
            "whether your range is wider or narrower than what some choice of weights can actually reach, "
            "coordinate by coordinate.",
            "A convex combination of numbers lies between the smallest and the largest of them, and putting all "
            "the weight on one token reaches that token's value exactly.",
            "No convex combination goes below the smallest value of a coordinate or above the largest: "
                 "the range is exactly the values' per-coordinate minimum and maximum."),
    },
    solution=("lumen.attention.MultiHeadAttention.attend_plain",),
)


# -- the MLP -----------------------------------------------------------------------------------------------

def _mlp_maps(mlp: nn.Module, d: int, d_ff: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    A1, c1 = affine(part(mlp, "fc"), d, "mlp.fc")
    if A1.shape != (d, d_ff):
        raise Mistake(f"mlp.fc maps {d} dimensions to {A1.size(1)}; expected {d_ff}", "d_ff")
    A2, c2 = affine(part(mlp, "proj"), d_ff, "mlp.proj")
    if A2.shape != (d_ff, d):
        raise Mistake(f"mlp.proj maps {d_ff} dimensions to {A2.size(1)}; expected {d}")
    return A1, c1, A2, c2


def _mlp_interface(m: ModuleType, ctx: Context) -> None:
    _mlp_maps(m.MLP(8), 8, 32)      # d_ff defaults to 4 d
    _mlp_maps(m.MLP(8, 12), 8, 12)


def _lumen_mlp(A1, c1, A2, c2, activation: str = "gelu", dropout: float = 0.0) -> MLP:
    ref = MLP(A1.size(0), A1.size(1), dropout, activation)
    set_linear(ref.fc, A1, c1), set_linear(ref.proj, A2, c2)
    return ref.eval()


def _mlp_values(m: ModuleType, ctx: Context) -> None:
    d, d_ff = 6, 20
    mlp = m.MLP(d, d_ff)
    randomise(mlp)
    mlp.eval()
    maps = _mlp_maps(mlp, d, d_ff)
    x = randn(2, 5, d, scale=1.5)
    y = tensor(mlp(x), "MLP(x)")
    if differs(y, _lumen_mlp(*maps)(x)):
        for act, hint in (("relu", "relu"), ("gelu_tanh", "tanh")):
            if not differs(y, _lumen_mlp(*maps, act)(x)):
                raise Mistake(f"the output is lumen's MLP with activation {act!r}, not exact GELU", hint)
        if not differs(y, part(mlp, "proj")(part(mlp, "fc")(x))):
            raise Mistake("the output is proj(fc(x)): nothing between the two matrices", "nonlinearity")
    expect_close(y, _lumen_mlp(*maps)(x), "MLP(x)")


def _mlp_dropout(m: ModuleType, ctx: Context) -> None:
    d = 6
    mlp = m.MLP(d, 16, 0.5)
    randomise(mlp)
    maps = _mlp_maps(mlp.eval(), d, 16)
    x = randn(4, 8, d)
    if differs(tensor(mlp.eval()(x), "MLP(x)"), _lumen_mlp(*maps)(x)):
        raise Mistake("MLP(d, dropout=0.5) in eval mode is not the plain MLP: dropout is on at inference", "dropout")
    if not differs(tensor(mlp.train()(x), "MLP(x)"), _lumen_mlp(*maps)(x)):
        raise Mistake("MLP(d, dropout=0.5) in training mode drops nothing", "dropout")


MLP_EXERCISE = Exercise(
    name="mlp",
    section=FFN,
    title="the MLP: expand to 4d, squash with GELU, project back",
    task="""\
Write the chapter's MLP: expand each token's d_model-vector to d_ff hidden units with W1 (self.fc), apply
exact GELU element by element, project back to d_model with W2 (self.proj), then dropout:

    MLP(x) = Dropout(GELU(x W1 + b1) W2 + b2)         d_ff defaults to 4 * d_model

The same W1, W2 act on every position. fc and proj may be nn.Linear (as the chapter's) or your own layout:
the checks read the affine map each one computes.""",
    template='''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_model, d_ff=None, dropout=0.0):
        super().__init__()
        # self.fc: W1, expand; self.proj: W2, project back; self.drop
        raise NotImplementedError

    def forward(self, x):                        # x: (..., d_model)
        raise NotImplementedError
''',
    specs=(Spec("MLP", "class", "class MLP(nn.Module) with __init__(self, d_model, d_ff=None, dropout=0.0) and "
                "forward(self, x)", args=(8,), kwargs={"d_ff": 16, "dropout": 0.0}, forward_args=("x",)),),
    checks=(
        Check("fc expands d_model to d_ff (4 d_model by default) and proj projects back, both affine", _mlp_interface),
        Check("equal to lumen's MLP (exact GELU) with the same weights, on random inputs", _mlp_values),
        Check("dropout on the output in training, and off in eval mode", _mlp_dropout),
    ),
    hints={
        "task": "Two affine maps with exact GELU between them: fc expands d_model to d_ff (4 d_model by default), "
                "proj brings it back, dropout on the output (nn.Linear, F.gelu and nn.Dropout are the chapter's "
                "parts).",
        "d_ff": Hint(
            "the width fc expands to when d_ff is not given.",
            "MLP(x) = W2 GELU(W1 x + b1) + b2 with W1 of shape (d_ff, d): the hidden width is 4 d by default.",
            "d_ff = d_ff or 4 * d_model: the chapter's expansion by four when no width is given."),
        "relu": Hint(
            "the nonlinearity between fc and proj, on negative inputs.",
            "MLP(x) = proj(GELU(fc(x))), GELU(u) = u Phi(u): slightly negative for negative u, never cut to 0.",
            "The chapter's MLP uses GELU, not ReLU: F.gelu(u), which keeps a little of the negative answers."),
        "tanh": Hint(
            "which GELU your forward calls: exact, or an approximation.",
            "GELU(u) = u Phi(u), Phi the normal CDF (the exact form, with erf).",
            "The exercise asks for exact GELU, x Phi(x): F.gelu(u) without approximate='tanh' "
                "(GPT-2 was trained with the tanh form; lumen's MLP default is the exact one)."),
        "nonlinearity": Hint(
            "what happens between fc and proj.",
            "MLP(x) = proj(GELU(fc(x))): without the nonlinearity, proj(fc(x)) is one linear map.",
            "Two matrices in a row are one matrix: put GELU between fc and proj."),
        "dropout": Hint(
            "what forward does with the dropout rate, in training and in evaluation mode.",
            "MLP(x) = Dropout(proj(GELU(fc(x)))): dropout on the output, in training only.",
            "Apply nn.Dropout(dropout) to the output: it drops in training and is the identity after "
                   ".eval(); a hand-written dropout must look at self.training."),
    },
    solution=("lumen.block.MLP",),
)


# -- the worked example ------------------------------------------------------------------------------------

def _worked_function(m: ModuleType, ctx: Context) -> None:
    for shape, hidden in (((3,), 5), ((4, 3), 5), ((2, 3, 2), 7)):
        d = shape[-1]
        x, W1, W2 = randn(*shape), randn(d, hidden), randn(hidden, d)
        try:
            y = tensor(m.mlp_update(x.clone(), W1.clone(), W2.clone()), "mlp_update(x, W1, W2)")
        except RuntimeError as e:
            if "shape" in str(e) or "size" in str(e):
                raise Mistake(f"x of shape {shape}, W1 ({d}, {hidden}), W2 ({hidden}, {d}) raised: "
                              f"{' '.join(str(e).split())}", "shapes") from None
            raise
        mlp = worked_mlp(x, W1, W2)
        want = (x + mlp(x)).detach()
        if differs(y, want):
            if not differs(y, mlp(x)):
                raise Mistake("mlp_update returns the MLP's write alone, not the stream after it", "residual")
            for act, hint in (("relu", "relu"), ("gelu_tanh", "tanh")):
                mlp.act = ACTIVATIONS[act]
                if not differs(y, x + mlp(x)):
                    raise Mistake(f"the result is the update with {act!r} instead of exact GELU", hint)
        expect_close(y, want, f"mlp_update for x of shape {shape}")


def _worked_number(m: ModuleType, ctx: Context) -> None:
    got = m.STREAM_AFTER
    if got is ... or (isinstance(got, list | tuple) and any(v is ... for v in got)):
        raise Mistake("STREAM_AFTER is not answered yet")
    try:
        got = [float(v) for v in got]
    except (TypeError, ValueError):
        raise Mistake(f"STREAM_AFTER = {got!r} is not two numbers") from None
    exact = worked_result()
    write = [v - x for v, x in zip(exact, WORKED_X)]
    if len(got) != 2:
        raise Mistake(f"STREAM_AFTER has {len(got)} numbers; the stream has d = 2")
    if all(abs(a - b) <= 5e-4 for a, b in zip(got, exact)):
        return
    shown = "[" + ", ".join(f"{v:.3f}" for v in got) + "]"
    if all(abs(a - b) <= 5e-4 for a, b in zip(got, WORKED_ROUNDED)):
        raise Mistake(f"STREAM_AFTER = {shown} is the chapter's figure; to three decimals the exact value differs",
                      "rounded")
    if all(abs(a - b) <= 5e-4 for a, b in zip(got, write)):
        raise Mistake(f"STREAM_AFTER = {shown} is the MLP's write, not the stream after it", "residual")
    raise Mistake(f"STREAM_AFTER = {shown} is not lumen's result to within 0.0005")


def _tuple_literal(rows: tuple) -> str:
    return "[" + ", ".join("[" + ", ".join(str(v) for v in row) + "]" for row in rows) + "]"


WORKED = Exercise(
    name="worked-mlp",
    section=FFN,
    title="the chapter's worked example: [1, -1] through a 2 -> 4 -> 2 MLP",
    task="""\
The chapter's tiny MLP: d = 2, a hidden width of 4, x = [1, -1]. x W1 = [1, -1, -2, 0], GELU gives
h = [0.84, -0.16, -0.05, 0], and h W2 is the MLP's write, which the residual connection adds to x.

1. Write mlp_update(x, W1, W2): the stream after the MLP, x + GELU(x W1) W2 (exact GELU, no biases), for x of
   shape (..., d), W1 (d, hidden) and W2 (hidden, d).
2. Fill in STREAM_AFTER: the stream after the MLP for the chapter's x, to three decimals (checked to 0.0005).

W1 and W2 below reconstruct the chapter's (its text states the numbers above but not the matrices).""",
    template=f'''\
import torch
import torch.nn.functional as F

x = torch.tensor([{WORKED_X[0]}, {WORKED_X[1]}])
W1 = torch.tensor({_tuple_literal(WORKED_W1)})   # d x 4: column j is unit j's key
W2 = torch.tensor({_tuple_literal(WORKED_W2)})   # 4 x d: row j is what unit j writes


def mlp_update(x, W1, W2):
    """The residual stream after the MLP: x + GELU(x W1) W2, for x of shape (..., d)."""
    raise NotImplementedError


STREAM_AFTER = [..., ...]   # mlp_update(x, W1, W2) for the chapter's x, to three decimals
''',
    specs=(Spec("mlp_update", "function", "def mlp_update(x, W1, W2)", args=(None, None, None)),
           Spec("STREAM_AFTER", "value", "STREAM_AFTER = [a, b]")),
    checks=(
        Check("mlp_update equals x + lumen's MLP(x) (exact GELU, no biases) on random shapes", _worked_function),
        Check("STREAM_AFTER is the stream after the MLP for x = [1, -1], to 0.0005", _worked_number, gate=False),
    ),
    hints={
        "task": "The stream after the MLP is x plus the MLP's write: expand with x @ W1, apply exact GELU, project "
                "back with @ W2. STREAM_AFTER is your function's value for the chapter's x, to three decimals.",
        "shapes": Hint(
            "the shapes: x (..., d), W1 (d, hidden), W2 (hidden, d); which side W1 multiplies from.",
            "x W1 is (..., hidden): each hidden unit is x dotted with a column of W1; then GELU, then @ W2 back to d.",
            "W1 is (d, hidden) and multiplies from the right: x @ W1 (each hidden unit is x dotted with a "
                  "column of W1), then @ W2."),
        "residual": Hint(
            "what your function returns: the MLP's write, or the stream after it.",
            "stream after = x + GELU(x W1) W2: the write is added to the stream that came in.",
            "The MLP writes into the stream by addition: the stream after it is x + write, not the write."),
        "relu": Hint(
            "the nonlinearity you apply to x W1 = [1, -1, -2, 0], and what it gives at -1.",
            "h = GELU(x W1) = [0.84, -0.16, -0.05, 0]: GELU(-1) is -0.16.",
            "The example uses GELU: GELU(-1) = -0.16, where ReLU would give 0."),
        "tanh": Hint(
            "which GELU you apply: exact, or an approximation.",
            "GELU(u) = u Phi(u), Phi the normal CDF (the exact form, with erf).",
            "Use exact GELU (F.gelu without approximate='tanh'), as the chapter's numbers do."),
        "rounded": Hint(
            "STREAM_AFTER: whether it comes from your function, or from the chapter's rounded numbers.",
            "STREAM_AFTER = mlp_update(x, W1, W2) at full precision, then rounded to three decimals at the end.",
            "The chapter rounds h to [0.84, -0.16, -0.05, 0] before projecting back, which gives [1.79, "
                   "-1.21]; carrying GELU's full precision gives [1.796, -1.204] (docs/confusions.md)."),
    },
    solution=("lumen.block.MLP",),
)


# -- GELU --------------------------------------------------------------------------------------------------

def _gelu_values(m: ModuleType, ctx: Context) -> None:
    for shape, dtype in (((1000,), torch.float32), ((3, 7, 11), torch.float32), ((257,), torch.float64)):
        x = randn(*shape, scale=3.0, dtype=dtype)
        y = tensor(m.gelu(x.clone()), "gelu(x)")
        want = ACTIVATIONS["gelu"](x)
        if not differs(y, want, rtol=1e-5, atol=2e-6):
            continue
        wrong = {"relu": ACTIVATIONS["relu"](x), "tanh": ACTIVATIONS["gelu_tanh"](x),
                 "silu": ACTIVATIONS["silu"](x), "sqrt2": x * 0.5 * (1 + torch.erf(x))}
        for hint, z in wrong.items():
            if not differs(y, z, rtol=1e-5, atol=2e-6):
                raise Mistake(f"gelu(x) equals {'x Phi_wrong(x)' if hint == 'sqrt2' else hint}(x) "
                              "on random inputs, not exact GELU", hint)
        expect_close(y, want, f"gelu(x) for x of shape {shape} ({dtype})", rtol=1e-5, atol=2e-6)


def _gelu_chapter(m: ModuleType, ctx: Context) -> None:
    x = torch.tensor([1.0, -1.0, -2.0, 0.0])
    y = tensor(m.gelu(x), "gelu(x)")
    if differs(y, torch.tensor([0.84, -0.16, -0.05, 0.0]), rtol=0, atol=0.005) or y.shape != (4,) or y[3] != 0:
        raise Mistake(f"gelu([1, -1, -2, 0]) = {[round(v, 3) for v in y.tolist()]}; the chapter: "
                      "[0.84, -0.16, -0.05, 0]")


def _gelu_minimum(m: ModuleType, ctx: Context) -> None:
    x = torch.linspace(-3, 0, 30001, dtype=torch.float64)
    y = tensor(m.gelu(x), "gelu(x)").double()
    lowest, at = y.min().item(), x[y.argmin()].item()
    ours = ACTIVATIONS["gelu"](x)
    if abs(lowest - ours.min().item()) > 1e-4 or abs(at - x[ours.argmin()].item()) > 0.01:
        raise Mistake(f"your GELU's minimum is {lowest:.3f} at x = {at:.2f}; the chapter: about -0.17 at -0.75")


GELU = Exercise(
    name="gelu",
    section="GELU, and why not ReLU",
    title="exact GELU from its formula, x Phi(x) (minimum -0.17 at -0.75)",
    task="""\
Write GELU from its formula: GELU(x) = x Phi(x), where Phi is the standard normal cumulative distribution
function, Phi(x) = (1 + erf(x / sqrt(2))) / 2. Exact GELU, not the tanh approximation, element by element,
for a tensor of any shape. The chapter's numbers: GELU(1) = 0.84, GELU(-1) = -0.16, GELU(-2) = -0.05,
GELU(0) = 0, and a minimum of about -0.17 at x = -0.75. (F.gelu would be the answer: write it yourself.)""",
    template='''\
import math

import torch


def gelu(x):
    """GELU(x) = x Phi(x), element by element."""
    raise NotImplementedError
''',
    specs=(Spec("gelu", "function", "def gelu(x)", args=(torch.zeros(1),)),),
    checks=(
        Check("equal to exact GELU (lumen's ACTIVATIONS['gelu']) on random inputs, shapes and dtypes", _gelu_values),
        Check("the chapter's numbers: GELU(1, -1, -2, 0) = 0.84, -0.16, -0.05, 0", _gelu_chapter),
        Check("the minimum: about -0.17 at x = -0.75", _gelu_minimum),
    ),
    hints={
        "task": "Phi is the standard normal cumulative distribution function, and torch.erf gives it: Phi(x) = (1 + "
                "erf(x / sqrt(2))) / 2.",
        "relu": Hint(
            "what your gelu gives for negative x, e.g. gelu(torch.tensor(-1.0)).",
            "GELU(x) = x Phi(x): for x < 0, Phi(x) > 0, so GELU(x) is small and negative (GELU(-1) = -0.16).",
            "ReLU, max(0, x), is what GELU smooths: GELU dips below zero for negative x (GELU(-1) = -0.16)."),
        "tanh": Hint(
            "the function inside your Phi: erf, or tanh.",
            "GELU(x) = x Phi(x), Phi(x) = (1 + erf(x / sqrt(2))) / 2.",
            "That is the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), close to "
                "GELU but not it: the exercise asks for x Phi(x) with the error function."),
        "silu": Hint(
            "what multiplies x in your gelu.",
            "GELU(x) = x Phi(x), Phi the standard normal CDF, (1 + erf(x / sqrt(2))) / 2.",
            "That is SiLU, x sigmoid(x), the same idea with a sigmoid: GELU uses the normal CDF Phi."),
        "sqrt2": Hint(
            "the argument you give erf.",
            "Phi(x) = (1 + erf(x / sqrt(2))) / 2.",
            "Phi(x) = (1 + erf(x / sqrt(2))) / 2: erf is the CDF of a normal with variance 1/2, so its "
                 "argument is divided by sqrt(2)."),
    },
    solution=("lumen.config.ACTIVATIONS",),
)


# -- SwiGLU ------------------------------------------------------------------------------------------------

def _swiglu_maps(s: nn.Module, d: int, d_ff: int) -> list[torch.Tensor]:
    maps = []
    for name, d_in, d_out in (("w_gate", d, d_ff), ("w_up", d, d_ff), ("w_down", d_ff, d)):
        A, c = affine(part(s, name), d_in, f"swiglu.{name}")
        if A.shape != (d_in, d_out):
            raise Mistake(f"swiglu.{name} maps {d_in} dimensions to {A.size(1)}; expected {d_out}")
        if c.abs().max() > 0:
            raise Mistake(f"swiglu.{name} adds a bias (its output at x = 0 is not 0)", "bias")
        maps.append(A)
    return maps


def _swiglu_interface(m: ModuleType, ctx: Context) -> None:
    s = m.SwiGLU(6, 16)
    randomise(s)
    _swiglu_maps(s, 6, 16)


def _lumen_swiglu(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, cls: type = SwiGLU, **kw) -> SwiGLU:
    ref = cls(gate.size(0), gate.size(1), **kw)
    set_linear(ref.w_gate, gate, None), set_linear(ref.w_up, up, None), set_linear(ref.w_down, down, None)
    return ref


def _swiglu_values(m: ModuleType, ctx: Context) -> None:
    d, d_ff = 6, 16
    s = m.SwiGLU(d, d_ff)
    randomise(s)
    gate, up, down = _swiglu_maps(s, d, d_ff)
    x = randn(3, 4, d, scale=1.5)
    y = tensor(s(x), "SwiGLU(x)")
    if differs(y, _lumen_swiglu(gate, up, down)(x)):
        if not differs(y, _lumen_swiglu(up, gate, down)(x)):
            raise Mistake("the output is SiLU(x W_up) * (x W_gate): the gate and the up branch are swapped", "gate")
        for act in ("gelu", "gelu_tanh"):
            if not differs(y, _lumen_swiglu(gate, up, down, GeGLU, activation=act)(x)):
                raise Mistake(f"the gate is {act}, not SiLU", "silu")
        if not differs(y, ((x @ gate) * (x @ up)) @ down):
            raise Mistake("the gate has no nonlinearity: (x W_gate) * (x W_up)", "silu")
    expect_close(y, _lumen_swiglu(gate, up, down)(x), "SwiGLU(x)")


def _swiglu_count(m: ModuleType, ctx: Context) -> None:
    for d in (48, 96):
        d_ff = 8 * d // 3
        n = sum(p.numel() for p in m.SwiGLU(d, d_ff).parameters())
        want = formula(ModelConfig(vocab_size=8, d_model=d, n_layers=1, n_heads=4, mlp="swiglu", d_ff=d_ff)).mlp
        if n != want:
            raise Mistake(f"SwiGLU({d}, {d_ff}) has {n:,} parameters; lumen's accounting: 3 d d_ff = {want:,}")
    if want != 8 * d * d:
        raise AssertionError("accounting: SwiGLU at d_ff = 8/3 d should be 8 d^2")


SWIGLU_EXERCISE = Exercise(
    name="swiglu",
    section="GELU, and why not ReLU",
    title="SwiGLU, the gated MLP of Llama: three matrices, 8 d^2 at d_ff = 8/3 d",
    task="""\
Write SwiGLU (Shazeer 2020), the MLP of Llama-family models: a SiLU gate decides how much of each "up"
feature passes, and W_down writes the result back; three matrices, no biases:

    SwiGLU(x) = W_down( SiLU(x W_gate) * (x W_up) )        SiLU(u) = u sigmoid(u)

With the usual d_ff = 8/3 d its three d x d_ff matrices hold 8 d^2 weights, as a 4d GELU MLP's two do.""",
    template='''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        # self.w_gate, self.w_up: d_model -> d_ff; self.w_down: d_ff -> d_model (no biases)
        raise NotImplementedError

    def forward(self, x):
        raise NotImplementedError
''',
    specs=(Spec("SwiGLU", "class", "class SwiGLU(nn.Module) with __init__(self, d_model, d_ff) and forward(self, x)",
                args=(8, 16), forward_args=("x",)),),
    checks=(
        Check("w_gate and w_up map d_model -> d_ff, w_down maps back, all without biases", _swiglu_interface),
        Check("equal to lumen's SwiGLU with the same weights, on random inputs", _swiglu_values),
        Check("3 d d_ff parameters, lumen's accounting (8 d^2 at d_ff = 8/3 d)", _swiglu_count),
    ),
    hints={
        "task": "Three bias-free linear maps; SiLU (F.silu) goes on the gate's output, which multiplies the up branch "
                "element by element before w_down.",
        "bias": Hint(
            "the three linear layers' constructor arguments: what each holds besides its weight.",
            "SwiGLU(x) = W_down (SiLU(W_gate x) * W_up x): three matrices of size d x d_ff and nothing added.",
            "SwiGLU's three matrices have no biases: nn.Linear(d_model, d_ff, bias=False)."),
        "gate": Hint(
            "which of the two expansions goes through the nonlinearity.",
            "SwiGLU(x) = W_down (SiLU(W_gate x) * W_up x): the gate's branch is squashed, the up branch passes "
            "linearly.",
            "The SiLU goes on w_gate's output; w_up's passes linearly and is multiplied by the gate."),
        "silu": Hint(
            "the nonlinearity on the gate's branch: which function it is.",
            "SiLU(x) = x sigma(x), the same idea as GELU = x Phi(x) with a sigmoid instead of Phi.",
            "The gate is SiLU, F.silu(u) = u * sigmoid(u): that is the 'Swi' (Swish) of SwiGLU; GELU there "
                "would be GeGLU (Gemma's)."),
    },
    solution=("lumen.block.SwiGLU",),
)

__all__ = ["GELU", "MIXING", "MLP_EXERCISE", "SWIGLU_EXERCISE", "WORKED", "worked_result"]
