"""Exercises of the block and what surrounds it: pre-LN vs post-LN, the full transformer block, dropout, the
GPT-2 initialisation with the 1/sqrt(2N) rule. The wiring is checked by running lumen's own block classes
(lumen.block) with the learner's parts in them, so the learner's parts may be laid out as they like."""

from __future__ import annotations

import math
from types import ModuleType

import torch
import torch.nn as nn

from ..block import ParallelBlock, PostLNBlock, TransformerBlock
from ..config import ModelConfig
from ..inspect.stack import stream_variance
from ..model import GPT
from .exercise import Check, Context, Exercise, Hint, Mistake, Spec
from .probes import differs, expect_close, part, randn, randomise, tensor

PARTS = ("ln1", "attn", "ln2", "mlp")

# a block whose output changes from call to call in evaluation mode: the pre-LN, post-LN and sandwich exercises
BLOCK_DROPOUT = Hint(
    "your block's output in evaluation mode: is it the same at every call?",
    "Dropout zeros a random 10% of activations during training and scales the rest by 1/0.9; at inference"
    " it is switched off.",
    "Dropout belongs to training: nn.Dropout is the identity after .eval(); do not apply your own "
    "dropout unconditionally.")


class _Part(nn.Module):
    """One of the learner's parts, called as lumen's block calls it (attention also gets mask and cache)."""

    def __init__(self, part: nn.Module):
        super().__init__()
        self.part = part

    def forward(self, x: torch.Tensor, *rest: object) -> torch.Tensor:
        return self.part(x)


def _with_parts(cls: type[TransformerBlock], block: nn.Module, d: int, heads: int) -> TransformerBlock:
    """lumen's block of class cls holding the learner's ln1, attn, ln2 and mlp."""
    ref = cls(d, heads)
    for name in PARTS:
        setattr(ref, name, _Part(part(block, name)))
    return ref.eval()


def _learner_block(m: ModuleType, cls: str, d: int = 16, heads: int = 4, dropout: float = 0.0) -> nn.Module:
    block = getattr(m, cls)(d, heads, None, dropout)
    for name in PARTS:
        if not isinstance(part(block, name), nn.Module):
            raise Mistake(f"{cls}.{name} is a {type(getattr(block, name)).__name__}, not an nn.Module")
    randomise(block, 0.3)   # norm gains and biases drawn too: ln1 and ln2 are told apart
    return block.eval()


def _interface(cls: str):
    def check(m: ModuleType, ctx: Context) -> None:
        block = _learner_block(m, cls)
        x = randn(2, 5, 16)
        y = tensor(block(x), f"{cls}(x)")
        if y.shape != x.shape:
            raise Mistake(f"{cls}(x) for x of shape (2, 5, 16) has shape {tuple(y.shape)}")
    return check


def _alternatives(block: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Other wirings of the same parts, each a mistake people make."""
    ln1, attn, ln2, mlp = (getattr(block, n) for n in PARTS)
    h = ln1(x)
    h = h + attn(h)
    stream = ln2(h)
    a = x + attn(ln1(x))
    return {
        "stream": stream + mlp(stream),              # the stream itself normalised
        "norms": a + mlp(ln1(a)),                    # ln1 twice, ln2 unused
        "residual": mlp(ln2(attn(ln1(x)))),          # no highway
        "residual-attn": attn(ln1(x)) + mlp(ln2(attn(ln1(x)))),   # attention's output replaces the stream
        "residual-mlp": mlp(ln2(a)),                 # the MLP's output replaces the stream
        # post-LN's: x = LN1(x + Attn(x)); x = LN2(x + MLP(x)) with an addition left out
        "residual-post": ln2(mlp(ln1(attn(x)))),
        "residual-post-attn": ln2(ln1(attn(x)) + mlp(ln1(attn(x)))),
        "residual-post-mlp": ln2(mlp(ln1(x + attn(x)))),
        "order": (x + ln1(attn(x))) + ln2(mlp(x + ln1(attn(x)))),   # the norm on the branch, after f
    }


def _values(cls: str, right: type[TransformerBlock], others: dict[str, type[TransformerBlock]],
            wirings: tuple[str, ...]):
    def check(m: ModuleType, ctx: Context) -> None:
        d, heads = 16, 4
        block = _learner_block(m, cls, d, heads)
        x = randn(3, 7, d)
        y = tensor(block(x), f"{cls}(x)").detach()
        want = _with_parts(right, block, d, heads)(x).detach()
        if differs(y, want):
            for hint, other in others.items():
                if not differs(y, _with_parts(other, block, d, heads)(x)):
                    doc = (other.__doc__ or "").splitlines()[0]
                    raise Mistake(f"your block computes lumen's {other.__name__} ({doc})", hint)
            for wiring, z in _alternatives(block, x).items():
                hint = wiring.split("-")[0]   # a residual missing on one branch is the residual mistake
                if hint in wirings and not differs(y, z):
                    raise Mistake(f"your block's output is {_WIRINGS[wiring]}", hint)
        expect_close(y, want, f"{cls}(x) against lumen's {right.__name__} with your parts")
    return check


_WIRINGS = {
    "stream": "x = LN1(x); x = x + Attn(x); x = LN2(x); x = x + MLP(x): the stream itself is normalised",
    "norms": "x + MLP(LN1(x)) after attention: ln1 used twice and ln2 not at all",
    "residual": "MLP(LN2(Attn(LN1(x)))): the residual additions are missing",
    "residual-attn": "h = Attn(LN1(x)); h + MLP(LN2(h)): attention's branch is not added to x (its residual is "
                     "missing)",
    "residual-mlp": "MLP(LN2(x + Attn(LN1(x)))): the MLP's branch is not added to the stream (its residual is "
                    "missing)",
    "residual-post": "LN2(MLP(LN1(Attn(x)))): the residual additions are missing",
    "residual-post-attn": "h = LN1(Attn(x)); LN2(h + MLP(h)): attention's branch is not added to x (its residual is "
                          "missing)",
    "residual-post-mlp": "LN2(MLP(LN1(x + Attn(x)))): the MLP's branch is not added to the stream (its residual is "
                         "missing)",
    "order": "x + LN(f(x)): the norm normalises the branch's output before the add",
}


def _dropout_off(cls: str, right: type[TransformerBlock]):
    def check(m: ModuleType, ctx: Context) -> None:
        block = _learner_block(m, cls, dropout=0.5)
        x = randn(2, 6, 16)
        if differs(tensor(block.eval()(x), f"{cls}(x)"), _with_parts(right, block, 16, 4)(x)):
            raise Mistake(f"{cls}(d, h, dropout=0.5) in eval mode does not compute the block: dropout is on at "
                          "inference", "dropout")
    return check


TEMPLATE_BLOCK = '''\
import torch
import torch.nn as nn

from lumen.attention import MultiHeadAttention
from lumen.block import MLP, LayerNorm      # or your own, from the layernorm and mlp exercises


class {cls}(nn.Module):
    """{doc}"""

    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__()
        # self.ln1, self.attn (MultiHeadAttention(d_model, n_heads)), self.ln2, self.mlp (MLP(d_model, d_ff, dropout)),
        # self.drop (dropout on attention's write)
        raise NotImplementedError

    def forward(self, x, mask=None):
        raise NotImplementedError
'''


def _block_spec(cls: str) -> Spec:
    return Spec(cls, "class", f"class {cls}(nn.Module) with __init__(self, d_model, n_heads, d_ff=None, dropout=0.0) "
                "and forward(self, x, mask=None)", args=(16, 4, None, 0.0), forward_args=("x",))


BLOCK = Exercise(
    name="block",
    section="The full transformer block",
    title="the pre-LN transformer block: two residual updates",
    task="""\
Write the chapter's pre-LN block: two residual updates in a row, the norm inside each branch:

    x = x + Attn(LN1(x))      # gather from context, write to stream
    x = x + MLP(LN2(x))       # think per token, write to stream

Its parts carry the chapter's names: ln1, attn, ln2, mlp (lumen's LayerNorm, MultiHeadAttention and MLP, or
your own: the checks run lumen's TransformerBlock with your parts in it and compare).""",
    template=TEMPLATE_BLOCK.format(cls="TransformerBlock",
                                   doc="Pre-LN block:  x = x + Attn(LN1(x));  x = x + MLP(LN2(x))"),
    specs=(_block_spec("TransformerBlock"),),
    checks=(
        Check("the parts ln1, attn, ln2, mlp; the output has the input's shape", _interface("TransformerBlock")),
        Check("equal to lumen's TransformerBlock holding your parts, on random inputs and weights",
              _values("TransformerBlock", TransformerBlock, {"post": PostLNBlock, "parallel": ParallelBlock},
                      ("stream", "norms", "residual", "order"))),
        Check("dropout off in eval mode", _dropout_off("TransformerBlock", TransformerBlock)),
    ),
    hints={
        "task": "Two residual updates: each branch reads a normalised copy of x and its output is added to x; "
                "attention first, then the MLP reading the updated x.",
        "post": Hint(
            "where your norms sit: around the branch's input, or around the sum.",
            "pre-LN: x = x + Attn(LN1(x)), then x = x + MLP(LN2(x)): the norm inside each branch, the stream "
            "never normalised.",
            "That is post-LN, x = LN(x + f(x)): in pre-LN the norm moves inside the branch, x = x + f(LN(x))."),
        "stream": Hint(
            "what you add the branch's output to: x itself, or a normalised x.",
            "pre-LN: x = x + Attn(LN1(x)): the branch reads LN1(x), the addition goes to the x that came in.",
            "Pre-LN never normalises the stream itself: keep x and add to it; only the branch's input is "
            "normalised, x + Attn(LN1(x))."),
        "parallel": Hint(
            "which x the MLP reads: the block's input, or the stream after attention wrote to it.",
            "two updates in a row: x = x + Attn(LN1(x)), then x = x + MLP(LN2(x)) with the new x.",
            "The MLP reads the stream after attention has written to it: compute x = x + Attn(LN1(x)) first, then "
            "x + MLP(LN2(x)) with that new x (reading both from the block's input is GPT-J's parallel block)."),
        "norms": Hint(
            "which norm each branch calls.",
            "x = x + Attn(LN1(x)); x = x + MLP(LN2(x)): two norms, one per branch.",
            "Each branch has its own norm: ln1 before attention, ln2 before the MLP."),
        "residual": Hint(
            "what each branch's output is added to: the line after attention, and the line after the MLP.",
            "pre-LN: x = x + Attn(LN1(x)), then x = x + MLP(LN2(x)): each branch writes into the stream it read.",
            "Each branch adds to the stream: x = x + ..., never x = ... (the residual highway)."),
        "order": Hint(
            "what each norm is applied to: the branch's input, or its output.",
            "pre-LN: x + f(LN(x)): normalise what the branch reads, add what it writes unchanged.",
            "The norm goes on the branch's input, x + f(LN(x)), not on its output."),
        "dropout": BLOCK_DROPOUT,
    },
    solution=("lumen.block.TransformerBlock.forward",),
)

POST_LN = Exercise(
    name="post-ln",
    section="LayerNorm: keeping the stream well-behaved",
    title="the post-LN block of the original transformer: the norm on the highway",
    task="""\
Write the original transformer's post-LN block: the norm sits after the residual add, on the highway
itself, so every block rescales the stream:

    x = LN1(x + Attn(x))
    x = LN2(x + MLP(x))

Parts: ln1, attn, ln2, mlp (lumen's LayerNorm, MultiHeadAttention and MLP, or your own).""",
    template=TEMPLATE_BLOCK.format(cls="PostLNBlock", doc="Post-LN block:  x = LN1(x + Attn(x));  x = LN2(x + MLP(x))"),
    specs=(_block_spec("PostLNBlock"),),
    checks=(
        Check("the parts ln1, attn, ln2, mlp; the output has the input's shape", _interface("PostLNBlock")),
        Check("equal to lumen's PostLNBlock holding your parts, on random inputs and weights",
              _values("PostLNBlock", PostLNBlock, {"pre": TransformerBlock}, ("order", "residual"))),
        Check("dropout off in eval mode", _dropout_off("PostLNBlock", PostLNBlock)),
    ),
    hints={
        "task": "Each line adds the branch's output to x and then normalises the sum: x = LN1(x + Attn(x)), then x = "
                "LN2(x + MLP(x)).",
        "pre": Hint(
            "where your norm sits: inside the branch, or after the residual add.",
            "Post-LN (the original transformer) puts the normalisation after the residual add: x <- LN(x + f(x))."
            " Pre-LN is x <- x + f(LN(x)).",
            "That is pre-LN, x + f(LN(x)): in post-LN the branch reads x itself and the norm comes after the "
               "add, x = LN(x + f(x))."),
        "order": Hint(
            "what your LayerNorm normalises: the branch's output alone, or the sum.",
            "x <- LN(x + f(x)): the LayerNorm sits on the residual highway, so every block rescales the stream.",
            "Normalise the sum, LN(x + f(x)), not the branch's output: the norm sits on the highway."),
        "residual": Hint(
            "what goes into each norm: the line with attention, and the line with the MLP.",
            "post-LN: x = LN1(x + Attn(x)), then x = LN2(x + MLP(x)): each norm takes the stream plus the branch.",
            "Add the branch to the stream before normalising: LN(x + f(x)), never LN(f(x)) (the residual highway)."),
        "dropout": BLOCK_DROPOUT,
    },
    solution=("lumen.block.PostLNBlock.forward",),
)


# -- dropout -----------------------------------------------------------------------------------------------

def _drop_inference(m: ModuleType, ctx: Context) -> None:
    for p in (0.1, 0.5):
        drop = m.Dropout(p).eval()
        x = torch.rand(10_000) + 1.0
        y = tensor(drop(x.clone()), "Dropout(p).eval()(x)")
        if y.shape != x.shape or not torch.equal(y, x):
            if y.shape == x.shape and torch.allclose(y, x * (1 - p)):
                raise Mistake(f"in eval mode Dropout({p}) multiplies by 1 - p", "test-scaling")
            zeros = float((y == 0).float().mean()) if y.shape == x.shape else float("nan")
            raise Mistake(f"in eval mode Dropout({p}) changes its input ({zeros:.0%} of it zeroed)", "inference")


def _drop_training(m: ModuleType, ctx: Context) -> None:
    n = 200_000
    for p in (0.1, 0.3, 0.0):
        drop = m.Dropout(p).train()
        x = torch.rand(n) + 1.0
        y = tensor(drop(x.clone()), "Dropout(p)(x)")
        if y.shape != x.shape:
            raise Mistake(f"Dropout({p})(x) has shape {tuple(y.shape)}; expected {tuple(x.shape)}")
        zeroed = float((y == 0).float().mean())
        spread = 5 * math.sqrt(max(p * (1 - p), 1e-12) / n)
        if abs(zeroed - p) > spread:
            hint = "keep" if abs(zeroed - (1 - p)) <= spread else "task"
            raise Mistake(f"in training Dropout({p}) zeroed {zeroed:.1%} of the inputs; expected {p:.0%}", hint)
        kept = y != 0
        if differs(y[kept], x[kept] / (1 - p), rtol=1e-5, atol=0):
            hint = "rescale" if not differs(y[kept], x[kept], rtol=1e-6, atol=0) else "task"
            raise Mistake(f"in training Dropout({p}) keeps the survivors at {float((y[kept] / x[kept]).mean()):.3f} "
                          f"times their value; expected 1 / (1 - p) = {1 / (1 - p):.3f}", hint)


def _drop_fresh(m: ModuleType, ctx: Context) -> None:
    drop = m.Dropout(0.5).train()
    x = torch.ones(4096)
    if torch.equal(tensor(drop(x), "Dropout(x)"), tensor(drop(x), "Dropout(x)")):
        raise Mistake("two calls in training dropped exactly the same units", "fresh")


def _drop_in_gpt(m: ModuleType, ctx: Context) -> None:
    cfg = ModelConfig(vocab_size=40, context=16, d_model=32, n_layers=2, n_heads=4, dropout=0.2)
    model = GPT(cfg)
    plain = GPT(cfg.replace(dropout=0.0))
    plain.load_state_dict(model.state_dict())
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Dropout):
                setattr(module, name, m.Dropout(cfg.dropout))
                swapped += 1
    idx = torch.randint(0, cfg.vocab_size, (2, 12))
    want = plain.eval()(idx)[0].detach()
    expect_close(model.eval()(idx)[0], want, f"a lumen GPT's logits in eval mode with your Dropout ({swapped} of them)",
                 "inference")
    if not differs(model.train()(idx)[0], want):
        raise Mistake("a lumen GPT with your Dropout in training mode gives the logits of one without dropout")


DROPOUT = Exercise(
    name="dropout",
    section="Dropout",
    title="dropout: zero a fraction p in training, scale the rest by 1/(1-p), switch off at inference",
    task="""\
Write dropout (Srivastava et al. 2014) as the chapter describes it: in training, zero each activation with
probability p and scale the survivors by 1/(1-p), so the expected value is unchanged; at inference (after
.eval()), do nothing. Don't call nn.Dropout or F.dropout: draw the mask yourself (torch.rand). A module
knows which mode it is in from self.training.""",
    template='''\
import torch
import torch.nn as nn


class Dropout(nn.Module):
    def __init__(self, p=0.1):
        super().__init__()
        raise NotImplementedError

    def forward(self, x):
        raise NotImplementedError
''',
    specs=(Spec("Dropout", "class", "class Dropout(nn.Module) with __init__(self, p=0.1) and forward(self, x)",
                args=(0.1,), forward_args=("x",)),),
    checks=(
        Check("at inference (eval mode) the output is the input, unchanged", _drop_inference),
        Check("in training a fraction p is zeroed and the rest scaled by 1/(1-p)", _drop_training),
        Check("a fresh mask at every call", _drop_fresh),
        Check("in lumen's GPT: eval logits equal those without dropout; training ones differ", _drop_in_gpt),
    ),
    hints={
        "task": "In training, draw a random mask (torch.rand_like(x) >= p keeps a unit), zero the rest and rescale "
                "the kept ones; self.training says which mode the module is in.",
        "inference": Hint(
            "what your forward returns after .eval(): is it different from x?",
            "Dropout zeros a random 10% of activations during training and scales the rest up by 1/0.9; at "
            "inference it is switched off.",
            "Dropout is switched off at inference: return x unchanged when not self.training "
                     "(model.eval() sets training = False on every module)."),
        "test-scaling": Hint(
            "in which mode your code scales the survivors up: in training, or in eval.",
            "Dropout zeros a fraction p during training and scales the rest up by 1/(1-p) (1/0.9 at rate 0.1); at"
            " inference it is switched off: the identity.",
            "Scale at training time (survivors times 1/(1-p)), not at inference time: then eval "
                        "mode is the plain identity."),
        "keep": Hint(
            "the fraction of activations your mask zeros when p = 0.1.",
            "Dropout at rate 0.1 zeros a random 10% of activations: p is the rate of zeros.",
            "p is the probability of dropping a unit, not of keeping it: keep where torch.rand_like(x) >= p."),
        "rescale": Hint(
            "the survivors: what they are multiplied by, and the mean of your output over many draws.",
            "Dropout zeros a random 10% of activations during training and scales the rest up by 1/0.9: 1/(1-p), "
            "so the expected value is unchanged.",
            "Scale the survivors by 1/(1-p): with a fraction p of zeros, that keeps each activation's "
                   "expected value what it is at inference."),
        "fresh": Hint(
            "two calls of your forward on the same x in training: do they drop the same units?",
            "Dropout zeros a random 10% of activations during training, so that no single unit can be relied on: "
            "a new random choice every time.",
            "Draw a new mask at every call (torch.rand_like(x)); do not seed or cache it."),
    },
    solution=("lumen.block.MLP.forward", "lumen.block.TransformerBlock.forward"),
)


# -- the GPT-2 initialisation ------------------------------------------------------------------------------

def _init_model(n_layers: int, seed: int) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=500, context=64, d_model=64, n_layers=n_layers, n_heads=4)
    model = GPT(cfg)
    with torch.no_grad():   # scramble what the initialisation must set (norms keep their ones and zeros)
        for name, p in model.named_parameters():
            if not name.split(".")[-2].startswith("ln"):
                p.uniform_(-1.0, 1.0)
    return model


WRITES = ("attn.out.weight", "mlp.proj.weight")   # the two matrices per block that write into the stream


def _init_stds(m: ModuleType, ctx: Context) -> None:
    N = 6
    model = _init_model(N, ctx.seed)
    m.init_gpt2(model)
    lumen = GPT(model.cfg)   # lumen's own initialisation: the reference, tensor by tensor
    ref = dict(lumen.named_parameters())
    write_std = 0.02 / math.sqrt(2 * N)
    for name, p in model.named_parameters():
        got, want = p.detach().float(), ref[name].detach().float()
        if name.split(".")[-2].startswith("ln"):
            if not torch.equal(got, want):
                raise Mistake(f"{name} changed: the norms keep g = 1 and b = 0", "norms")
            continue
        if want.abs().max() == 0:   # a bias
            if got.abs().max() > 0:
                raise Mistake(f"{name} is not zero (std {got.std().item():.3g})", "biases")
            continue
        s, s_ref = got.std().item(), want.std().item()
        if abs(got.mean().item()) > 0.2 * s_ref or not 0.85 < s / s_ref < 1.15:
            what = f"{name} has std {s:.4f}; lumen's init gives {s_ref:.4f}"
            if name.endswith(WRITES):
                hint = ("rule" if abs(s / 0.02 - 1) < 0.1 else "2N" if abs(s * math.sqrt(N) / 0.02 - 1) < 0.1
                        else "task")
            elif abs(s / write_std - 1) < 0.1:
                hint = "every"
            elif name.startswith(("tok_emb", "pos_emb")):
                hint = "embeddings"
            else:
                hint = "task"
            raise Mistake(what, hint)


def _init_depth(m: ModuleType, ctx: Context) -> None:
    N = 24
    model = _init_model(N, ctx.seed)
    m.init_gpt2(model)
    idx = torch.randint(0, model.cfg.vocab_size, (8, 32))
    ours, lumens = stream_variance(model.eval(), idx), stream_variance(GPT(model.cfg).eval(), idx)
    growth, lumen_growth = ours[-1] / ours[1], lumens[-1] / lumens[1]
    if not lumen_growth / 1.5 < growth < lumen_growth * 1.5:
        raise Mistake(f"through {N} blocks the stream's variance grows {growth:.2f}x after block 1; with lumen's "
                      f"init {lumen_growth:.2f}x")


INIT = Exercise(
    name="init",
    section="Initialisation and the 1/√(2N) residual trick",
    title="the GPT-2 initialisation, with 1/sqrt(2N) on the two matrices that write into the stream",
    task="""\
Write init_gpt2(model): initialise a lumen GPT (GPT-2 style: its blocks' attn.q/k/v/out and mlp.fc/proj are
nn.Linear) in place, as GPT-2 does:
  - every nn.Linear and nn.Embedding weight from N(0, 0.02^2), every bias 0 (norms untouched);
  - then the two matrices per block that write into the stream, attn.out and mlp.proj (W_O and W_2), from
    N(0, (0.02 / sqrt(2N))^2), N = the number of blocks, so that the stream keeps its size through depth.""",
    template='''\
import math

import torch.nn as nn


def init_gpt2(model):
    """GPT-2's initialisation of a lumen GPT, in place (model.blocks, model.n_layers)."""
    raise NotImplementedError
''',
    specs=(Spec("init_gpt2", "function", "def init_gpt2(model)", args=(None,)),),
    checks=(
        Check("every tensor drawn as lumen's initialisation draws it (std within 15%, biases 0, norms untouched)",
              _init_stds),
        Check("the stream's variance through 24 blocks grows as little as with lumen's initialisation (within 1.5x)",
              _init_depth),
    ),
    hints={
        "task": "Walk model.modules() for nn.Linear and nn.Embedding (N(0, 0.02^2) weights, zero biases); then find "
                "the two stream-writing matrices per block by name (attn.out, mlp.proj) and draw them again with the "
                "smaller std.",
        "every": Hint(
            "which weights get the smaller std: compare the list with the matrices that write into the stream.",
            "Scale the initialisation of the two output projections in each block, W_O and W_2 (the matrices that"
            " write into the stream), by 1/sqrt(2N).",
            "Only the two matrices that write into the stream get 1/sqrt(2N): attn.out (W_O) and mlp.proj "
                 "(W_2); W_Q, W_K, W_V and W_1 stay at 0.02."),
        "rule": Hint(
            "the std of the output projections after your init: is it different from the other matrices'?",
            "GPT-2 initialises every weight matrix from N(0, 0.02^2), then one extra rule: W_O and W_2 of every "
            "block scaled by 1/sqrt(2N).",
            "The rule is missing: after the N(0, 0.02^2) pass, draw attn.out.weight and mlp.proj.weight "
                "again with std 0.02 / sqrt(2N)."),
        "2N": Hint(
            "what N counts in your 1/sqrt(...): the blocks, or the writes into the stream.",
            "Each block adds two write vectors to the stream: after N blocks the variance is about 2N sigma^2, so"
            " each of the 2N writes gets variance sigma^2 / (2N).",
            "Each block writes into the stream twice (attention, then the MLP): 2N writes, so the std is "
              "0.02 / sqrt(2 N), not 0.02 / sqrt(N)."),
        "biases": Hint(
            "the biases after your init: what values they hold.",
            "GPT-2 initialises every weight matrix from N(0, 0.02^2) and every bias at 0.",
            "Every bias starts at 0: nn.init.zeros_(module.bias)."),
        "embeddings": Hint(
            "which modules your init loop visits: only nn.Linear, or the embeddings too.",
            "GPT-2 initialises every weight matrix from N(0, 0.02^2), the token and position tables included.",
            "The embeddings (tok_emb and pos_emb, nn.Embedding) are drawn from N(0, 0.02^2) too."),
        "norms": Hint(
            "the LayerNorms' g and b after your init.",
            "LN(x) = g * (x - mu) / sqrt(sigma^2 + eps) + b starts as the plain normalisation: g = 1, b = 0. The "
            "init rule draws weight matrices only.",
            "Leave the norms alone: their g stays 1 and b stays 0 (only Linear and Embedding are drawn)."),
    },
    solution=("lumen.model.GPT._init_weights", "lumen.model.GPT.__init__"),
)
