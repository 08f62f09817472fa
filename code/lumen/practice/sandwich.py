"""An exercise on one family variant: Gemma 2's sandwich block, the sequel to pre-LN vs post-LN.

The chapter places the norm before the branch (pre-LN) or after the add (post-LN); Gemma 2 and 3 put a norm on
both sides of each branch, and the second one on the branch's write, not on the stream. The checks run lumen's
SandwichBlock (lumen.block) holding the learner's six parts, so the learner may build the parts as they like;
a wrong block is compared with lumen's other blocks and with the wirings people write by mistake.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn as nn

from ..block import BranchOutputNormBlock, SandwichBlock, TransformerBlock
from .blocks import BLOCK_DROPOUT, _Part
from .exercise import Check, Context, Exercise, Hint, Mistake, Spec
from .probes import differs, expect_close, part, randn, randomise, tensor

CLS = "SandwichBlock"
PARTS = ("ln1", "attn", "ln1_post", "ln2", "mlp", "ln2_post")
D, HEADS = 16, 4


def _learner_block(m: ModuleType, dropout: float = 0.0) -> nn.Module:
    block = getattr(m, CLS)(D, HEADS, None, dropout)
    for name in PARTS:
        if not isinstance(part(block, name), nn.Module):
            raise Mistake(f"{CLS}.{name} is a {type(getattr(block, name)).__name__}, not an nn.Module")
    randomise(block, 0.3)   # every norm's gain drawn at random: the four norms are told apart
    return block.eval()


def _lumens(cls: type[TransformerBlock], block: nn.Module, **parts: str) -> TransformerBlock:
    """lumen's block of class cls holding the learner's parts: parts maps lumen's name to the learner's."""
    ref = cls(D, HEADS)
    for name, theirs in parts.items():
        setattr(ref, name, _Part(part(block, theirs)))
    return ref.eval()


def _sandwich(block: nn.Module) -> TransformerBlock:
    """lumen's SandwichBlock with all six of the learner's parts (its post norms are set outside __init__)."""
    return _lumens(SandwichBlock, block, **{name: name for name in PARTS})


def _interface(m: ModuleType, ctx: Context) -> None:
    block = _learner_block(m)
    x = randn(2, 5, D)
    y = tensor(block(x), f"{CLS}(x)")
    if y.shape != x.shape:
        raise Mistake(f"{CLS}(x) for x of shape (2, 5, {D}) has shape {tuple(y.shape)}")


# the mistakes, each as lumen's own block holding some of the learner's parts, or as a wiring written out
_BLOCKS = {
    "pre": (TransformerBlock, dict(ln1="ln1", attn="attn", ln2="ln2", mlp="mlp"),
            "the post norms ln1_post and ln2_post are never applied"),
    "olmo": (BranchOutputNormBlock, dict(ln1="ln1_post", attn="attn", ln2="ln2_post", mlp="mlp"),
             "the branches read the raw stream: ln1 and ln2 are never applied"),
}


def _wirings(block: nn.Module, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, str]]:
    ln1, attn, ln1_post, ln2, mlp, ln2_post = (getattr(block, n) for n in PARTS)
    s = ln1_post(x + attn(ln1(x)))                     # the post norm on the sum: the stream is normalised
    w = x + ln1(attn(ln1_post(x)))                     # each pair of norms the other way round
    return {
        "stream": (ln2_post(s + mlp(ln2(s))),
                   "x = LN1_post(x + Attn(LN1(x))); x = LN2_post(x + MLP(LN2(x))): the post norms normalise the "
                   "stream"),
        "swapped": (w + ln2(mlp(ln2_post(w))),
                    "x = x + LN1(Attn(LN1_post(x))); x = x + LN2(MLP(LN2_post(x))): the pre and post norms swapped"),
    }


def _values(m: ModuleType, ctx: Context) -> None:
    block = _learner_block(m)
    x = randn(3, 7, D)
    y = tensor(block(x), f"{CLS}(x)").detach()
    want = _sandwich(block)(x).detach()
    if differs(y, want):
        for hint, (cls, parts, what) in _BLOCKS.items():
            if not differs(y, _lumens(cls, block, **parts)(x)):
                doc = (cls.__doc__ or "").splitlines()[0]
                raise Mistake(f"your block computes lumen's {cls.__name__} ({doc}): {what}", hint)
        for hint, (z, what) in _wirings(block, x).items():
            if not differs(y, z):
                raise Mistake(f"your block's output is {what}", hint)
    expect_close(y, want, f"{CLS}(x) against lumen's {CLS} with your parts")


def _dropout_off(m: ModuleType, ctx: Context) -> None:
    block = _learner_block(m, dropout=0.5)
    x = randn(2, 6, D)
    if differs(tensor(block(x), f"{CLS}(x)"), _sandwich(block)(x)):
        raise Mistake(f"{CLS}(d, h, dropout=0.5) in eval mode does not compute the block: dropout is on at "
                      "inference", "dropout")


SANDWICH = Exercise(
    name="sandwich",
    section="The full transformer block",
    title="a family variant: Gemma 2's sandwich block, a norm on both sides of each branch",
    task="""\
The chapter's pre-LN block normalises what each branch reads; post-LN normalises the stream after the
add. Gemma 2 and 3 keep pre-LN and normalise each branch's write as well, before it is added: a norm on
both sides of the branch, the stream itself never normalised:

    x = x + LN1_post(Attn(LN1(x)))      # read a normalised copy, normalise the write, add it
    x = x + LN2_post(MLP(LN2(x)))

Parts: ln1, attn, ln1_post, ln2, mlp, ln2_post (lumen's RMSNorm as Gemma has it, or LayerNorm, with
MultiHeadAttention and MLP, or your own: the checks run lumen's SandwichBlock with your parts in it).""",
    template='''\
import torch
import torch.nn as nn

from lumen.attention import MultiHeadAttention
from lumen.block import MLP, RMSNorm      # or LayerNorm, or your own


class SandwichBlock(nn.Module):
    """Sandwich block:  x = x + LN1_post(Attn(LN1(x)));  x = x + LN2_post(MLP(LN2(x)))"""

    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__()
        # self.ln1, self.attn (MultiHeadAttention(d_model, n_heads)), self.ln1_post,
        # self.ln2, self.mlp (MLP(d_model, d_ff, dropout)), self.ln2_post, self.drop (dropout on attention's write)
        raise NotImplementedError

    def forward(self, x, mask=None):
        raise NotImplementedError
''',
    specs=(Spec(CLS, "class", f"class {CLS}(nn.Module) with __init__(self, d_model, n_heads, d_ff=None, "
                "dropout=0.0) and forward(self, x, mask=None)", args=(D, HEADS, None, 0.0), forward_args=("x",)),),
    checks=(
        Check("the parts ln1, attn, ln1_post, ln2, mlp, ln2_post; the output has the input's shape", _interface),
        Check("equal to lumen's SandwichBlock holding your parts, on random inputs and weights", _values),
        Check("dropout off in eval mode", _dropout_off),
    ),
    hints={
        "task": "Pre-LN with one more norm per branch: the branch reads LN1(x), its output goes through LN1_post, "
                "and that is added to x; then the same for the MLP, reading the updated x.",
        "pre": Hint(
            "what happens to each branch's output before it is added to the stream.",
            "The sandwich norms both sides of each branch: x = x + LN1_post(Attn(LN1(x))); x = x + "
            "LN2_post(MLP(LN2(x))).",
            "That is the chapter's pre-LN block: normalise each branch's output too before adding it, "
               "x = x + LN1_post(Attn(LN1(x)))."),
        "stream": Hint(
            "what the post norm reads: the branch's write alone, or the stream after the add.",
            "x = x + LN1_post(Attn(LN1(x))): the highway stays pure addition, as in pre-LN; only the write is "
            "normalised.",
            "The post norm goes on the branch's write, not on the sum: x = x + LN1_post(...), never "
                  "x = LN1_post(x + ...) (that normalises the stream itself, as post-LN does)."),
        "olmo": Hint(
            "what each branch reads: the stream itself, or the stream normalised.",
            "x = x + LN1_post(Attn(LN1(x))): a norm before the branch (as pre-LN) and one after it.",
            "That is OLMo-2's block (x = x + LN(Attn(x))): the sandwich keeps the pre norm as well, so the "
                "branch reads LN1(x)."),
        "swapped": Hint(
            "which of the four norms you apply where: before a branch or after it.",
            "x = x + LN1_post(Attn(LN1(x))); x = x + LN2_post(MLP(LN2(x))): the plain norm on what the branch "
            "reads, the _post one on what it writes.",
            "ln1 and ln2 normalise what the branch reads; ln1_post and ln2_post normalise what it writes."),
        "dropout": BLOCK_DROPOUT,
    },
    solution=("lumen.block.SandwichBlock.forward", "lumen.block.TransformerBlock.from_config"),
)
