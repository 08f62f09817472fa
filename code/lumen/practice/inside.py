"""Exercises that look inside a model: deleting a block, the logit lens, an MLP unit as a key-value memory.
Checked against lumen.inspect on small random models of two families, and on the real SmolLM2 (a few
prompts) for the lens and the memory."""

from __future__ import annotations

from types import ModuleType

import torch

from .. import names
from ..block import MLP, LayerNorm, RMSNorm, SwiGLU, TransformerBlock
from ..inspect import capture, delete_blocks, replace_activation
from ..inspect.corpus import token_windows
from ..inspect.lens import LogitLens, lens_logits, streams
from ..inspect.neurons import top_activations, value_logits
from ..model import GPT
from ..tokenizers.shown import quoted
from .exercise import Check, Context, Exercise, Hint, Mistake, Spec
from .probes import differs, expect_close, state, tensor, tiny_models, token_ids

# -- deleting a block --------------------------------------------------------------------------------------

def _unchanged(model: GPT, before: dict, blocks: list, idx: torch.Tensor, logits: torch.Tensor) -> None:
    after = state(model)
    if list(model.blocks) != blocks or after.keys() != before.keys() or any(
            not torch.equal(after[k], before[k]) for k in before) or differs(model(idx)[0], logits):
        raise Mistake("after logits_without_block the model is not the one it was given: it must be left as found",
                      "restore")


def _delete(m: ModuleType, ctx: Context) -> None:
    for what, model in tiny_models(ctx.seed):
        idx = token_ids(model, 2, 10)
        with torch.no_grad():
            logits = model(idx)[0]
        for k in range(model.n_layers):
            before, blocks = state(model), list(model.blocks)
            got = tensor(m.logits_without_block(model, idx.clone(), k), "logits_without_block(model, idx, k)")
            _unchanged(model, before, blocks, idx, logits)
            with torch.no_grad(), delete_blocks(model, k):
                want = model(idx)[0]
            if not differs(got, want):
                continue
            with torch.no_grad():
                if got.shape == want.shape:
                    if not differs(got, logits):
                        raise Mistake(f"asked to delete block {k}, the result is the whole model's", "index")
                    with replace_activation(model, names.activation(k, "resid_post"), torch.zeros(())):
                        if not differs(got, model(idx)[0]):
                            raise Mistake(f"block {k}: the result is the model with the stream after block {k} set "
                                          "to zero", "zero")
                    for j in (k - 1, k + 1):
                        if 0 <= j < model.n_layers:
                            with delete_blocks(model, j):
                                if not differs(got, model(idx)[0]):
                                    raise Mistake(f"asked to delete block {k}, the result is the model without "
                                                  f"block {j}", "index")
                    for site in ("attn_out", "mlp_out"):
                        with replace_activation(model, names.activation(k, site), torch.zeros(())):
                            if not differs(got, model(idx)[0]):
                                raise Mistake(f"block {k}: only its {site.split('_')[0]} write is removed", "both")
            expect_close(got, want, f"logits without block {k} of {what}")


DELETE = Exercise(
    name="delete-block",
    section="Residual connections: the stream",
    title="delete a block: the stream passes it by unchanged",
    task="""\
The residual picture says that deleting a middle block of a trained transformer costs little, because the
stream carries everything the other blocks wrote. Write logits_without_block(model, idx, k): the logits
(B, T, vocab) of a lumen GPT run on token ids idx (B, T) with block k (counted from 0, as model.blocks[k])
deleted: its writes are gone and the stream passes from block k - 1 to block k + 1 unchanged. Leave the
model as you found it. (`with lumen.inspect.delete_blocks(model, k):` is the answer: write it yourself,
e.g. from model.embed, model.blocks, model.ln_f and model.lm_head.)""",
    template='''\
import torch


@torch.no_grad()
def logits_without_block(model, idx, k):
    """Logits (B, T, vocab) of `model` on idx (B, T) with block k deleted."""
    raise NotImplementedError
''',
    specs=(Spec("logits_without_block", "function", "def logits_without_block(model, idx, k)", args=(None, None, 0)),),
    checks=(Check("equal to lumen.inspect.delete_blocks for every block of two small random models, the model "
                  "left unchanged", _delete),),
    hints={
        "task": "Run the model's parts yourself: model.embed, then every block of model.blocks but block k, then "
                "model.ln_f and model.lm_head.",
        "zero": Hint(
            "what the stream is after the deleted block: what your code passes on to block k + 1.",
            "Each block reads from the stream and writes a vector back into it by addition; nothing erases the "
            "stream, so it survives without that block's write.",
            "Deleting a block is not zeroing the stream: the stream the block received passes on as it is; "
                "only the block's own writes are removed."),
        "index": Hint(
            "which block your code skips when k = 0 and when k is the last block.",
            "Blocks are counted from 0: block k is the (k + 1)-th of model.blocks.",
            "Block k is model.blocks[k], counted from 0 (k = 0 is the first block): skip exactly that one."),
        "both": Hint(
            "how many writes of block k your code removes: a block has two residual updates.",
            "A pre-LN block: x = x + Attn(LN1(x)); x = x + MLP(LN2(x)). Two writes into the stream.",
            "A block writes twice into the stream, attention then the MLP: deleting it removes both writes."),
        "restore": Hint(
            "the model's list of blocks after your function returns (and if it raises): is it the one it was "
            "given?",
            "Deleting a block for one run: its writes are gone from that run only; the model itself is the same "
            "before and after.",
            "Leave the model as it was: do not remove the block from model.blocks for good (run the "
                   "blocks yourself, or put it back in a finally)."),
    },
    solution=("lumen.inspect.cache.delete_blocks", "lumen.inspect.cache._Skip"),
)


# -- the logit lens ----------------------------------------------------------------------------------------

def _lens_compare(m: ModuleType, model: GPT, idx: torch.Tensor, what: str) -> None:
    got = tensor(m.logit_lens_top1(model, idx.clone()), "logit_lens_top1(model, idx)")
    with torch.no_grad():
        _, hs = streams(model, idx)
        hs = hs[:, 0]                                                   # (layers, T, d)
        z = lens_logits(LogitLens(model), hs, range(hs.size(0))).float()  # (layers, T, V)
    want = z.argmax(-1)
    rows = model.n_layers + 1
    if got.dim() == 3 and got.size(0) == rows and got.size(1) == 1:
        got = got[:, 0]
    if got.shape != want.shape:
        hint = "rows" if got.dim() == 2 and got.size(0) in (rows - 1, rows + 1) else "task"
        raise Mistake(f"for {what} ({model.n_layers} blocks, {idx.size(1)} tokens) the result has shape "
                      f"{tuple(got.shape)}; expected ({rows}, {idx.size(1)}): the embedding, then each block", hint)
    got = got.long()
    bad = got != want
    if bad.any():   # a near tie read in another order of summation is not a mistake
        gap = z.gather(-1, want[..., None]) - z.gather(-1, got.clamp(0, z.size(-1) - 1)[..., None])
        bad &= gap[..., 0] > 1e-4 * z.abs().amax(-1)
    if bad.any():
        with torch.no_grad():
            raw = model.lm_head(hs).float().argmax(-1)
        if not (got != raw).any():
            raise Mistake(f"for {what}, your top-1 tokens are those of the unembedding applied to the raw stream",
                          "final-norm")
        layer, pos = (int(v) for v in bad.nonzero()[0])
        after = "the embedding" if layer == 0 else f"block {layer - 1}"
        raise Mistake(f"for {what}, {int(bad.sum())} of {bad.numel()} top-1 tokens differ from lumen's logit lens, "
                      f"first at row {layer} (the stream after {after}), position {pos}")


def _lens_tiny(m: ModuleType, ctx: Context) -> None:
    for what, model in tiny_models(ctx.seed):
        _lens_compare(m, model, token_ids(model, 1, 9), what)


LENS_PROMPTS = ("The capital of France is", "The Eiffel Tower is in the city of", "One, two, three, four,")


def _lens_smollm2(m: ModuleType, ctx: Context) -> None:
    model, tok = ctx.smollm2.model, ctx.smollm2.tokenizer
    for prompt in LENS_PROMPTS:
        _lens_compare(m, model, torch.tensor([tok.encode(prompt)]), f"SmolLM2 on {prompt!r}")


LENS = Exercise(
    name="logit-lens",
    section="Stacking N blocks: what the layers do",
    title="the logit lens: read every layer's stream through the final norm and unembedding (SmolLM2)",
    task="""\
The logit lens (nostalgebraist 2020): take the residual stream after the embedding and after every block,
apply the model's own final step (the final norm, then the unembedding) and read off the most likely next
token. Write logit_lens_top1(model, idx): for a lumen GPT and one prompt's token ids idx (1, T), the top-1
token id at every layer and position, shape (n_layers + 1, T): row 0 reads the embedding, row l the stream
after block l - 1; the last row is the model's own prediction. Checked against lumen.inspect.logit_lens on
small random models, then on SmolLM2 (loaded from lumen's cache, a few prompts).""",
    template='''\
import torch


@torch.no_grad()
def logit_lens_top1(model, idx):
    """(n_layers + 1, T) top-1 token ids; model.embed, model.blocks, model.ln_f, model.lm_head are its parts."""
    raise NotImplementedError
''',
    specs=(Spec("logit_lens_top1", "function", "def logit_lens_top1(model, idx)", args=(None, None)),),
    checks=(
        Check("lumen's logit-lens top-1 at every layer and position of two small random models", _lens_tiny),
        Check("lumen's logit-lens top-1 on SmolLM2, three prompts", _lens_smollm2, smollm2=True),
    ),
    hints={
        "task": "Collect the stream after model.embed and after every block, apply model.ln_f and model.lm_head to "
                "each, and take the argmax over the vocabulary.",
        "final-norm": Hint(
            "what you apply to each layer's stream before reading logits, and what the model's own last step "
            "does.",
            "The final step of a language model: take the residual stream, apply the final LayerNorm, multiply by"
            " the unembedding matrix, and read off logits.",
            "Apply the final norm before the unembedding, lm_head(ln_f(h)): the unembedding was trained "
                      "on normalised streams (and the pre-LN stream itself is never normalised)."),
        "rows": Hint(
            "how many rows your answer has, and what the first row reads.",
            "The lens reads every stream: after the embedding, and after each of the N blocks.",
            "One row per stream: the embedding's output first, then the stream after each of the n_layers "
                "blocks, n_layers + 1 rows."),
    },
    solution=("lumen.inspect.lens.logit_lens", "lumen.inspect.lens.Lens.unembed"),
)


# -- an MLP unit as a key-value memory ---------------------------------------------------------------------

def _block(model: GPT, layer: int) -> TransformerBlock:
    block = model.blocks[layer]
    assert isinstance(block, TransformerBlock)   # every block of a GPT is one (pre-LN, post-LN or parallel)
    return block


def _kv_hidden(m: ModuleType, ctx: Context) -> None:
    for what, model in tiny_models(ctx.seed):
        idx = token_ids(model, 2, 8)
        for layer in range(model.n_layers):
            got = tensor(m.unit_activations(model, idx.clone(), layer), "unit_activations(model, idx, layer)")
            want = capture(model, idx, names.activation(layer, "mlp_hidden"))
            block = _block(model, layer)
            if differs(got, want) and got.shape == want.shape and isinstance(block.mlp, MLP):
                pre = block.mlp.fc(block.ln2(capture(model, idx, names.activation(layer, "resid_mid"))))
                if not differs(got, pre):
                    raise Mistake(f"block {layer} of {what}: your activations are W1's output before GELU", "pre")
            expect_close(got, want, f"unit_activations of block {layer} of {what}")


def _same_direction(got: torch.Tensor, want: torch.Tensor) -> bool:
    """got = c want for some c > 0 (the stream's size divides every logit alike)."""
    got, want = got.double().flatten(), want.double().flatten()
    if got.shape != want.shape:
        return False
    c = (got @ want) / (want @ want)
    return bool(c > 0) and bool((got - c * want).norm() <= 1e-4 * (c * want).norm())


def _value_compare(m: ModuleType, model: GPT, layer: int, unit: int, what: str) -> None:
    got = tensor(m.value_logits(model, layer, unit), "value_logits(model, layer, unit)").detach()
    want = value_logits(model, layer, unit)
    if _same_direction(got, want):
        return
    mlp, ln_f = _block(model, layer).mlp, model.ln_f
    assert isinstance(mlp, MLP | SwiGLU) and isinstance(ln_f, LayerNorm | RMSNorm)   # every family lumen builds
    value = mlp.down.weight[:, unit]
    centred = value - value.mean() if isinstance(ln_f, LayerNorm) else value
    with torch.no_grad():
        if _same_direction(got, model.lm_head(centred)):
            raise Mistake(f"{what}: your logits leave out the final norm's gain", "gain")
        if isinstance(ln_f, LayerNorm) and _same_direction(got, model.lm_head(value * ln_f.g)):
            raise Mistake(f"{what}: your logits read the value vector without removing its mean", "centre")
        key = (mlp.fc if isinstance(mlp, MLP) else mlp.w_up).weight[unit]
        key = key - key.mean() if isinstance(ln_f, LayerNorm) else key
        if _same_direction(got, model.lm_head(key * ln_f.gain)):
            raise Mistake(f"{what}: your logits read the unit's key (its row of W1), not its value", "key")
    raise Mistake(f"{what}: your logits are not lumen's value_logits (nor a positive multiple of them)")


def _kv_values(m: ModuleType, ctx: Context) -> None:
    for what, model in tiny_models(ctx.seed):
        for layer, unit in ((0, 3), (model.n_layers - 1, 17)):
            _value_compare(m, model, layer, unit, f"block {layer} unit {unit} of {what}")


NEURON_WINDOWS = dict(n=16, seq_len=64, seed=0)   # what `lumen neurons smollm2 --block B --windows 16` reads
NEURON_CONTEXTS = 8                               # and its --contexts
TRIGGER_SHARE = 0.6


def _kv_found(m: ModuleType, ctx: Context) -> None:
    model, tok = ctx.smollm2.model, ctx.smollm2.tokenizer
    layer, unit, trigger = m.LAYER, m.UNIT, m.TRIGGER
    if layer is ... or unit is ... or trigger is ...:
        raise Mistake("LAYER, UNIT and TRIGGER are not answered yet", "find")
    if not (isinstance(layer, int) and isinstance(unit, int) and isinstance(trigger, str)):
        raise Mistake(f"LAYER = {layer!r}, UNIT = {unit!r} must be whole numbers and TRIGGER = {trigger!r} a string")
    if not (0 <= layer < model.n_layers and 0 <= unit < model.blocks[layer].mlp.down.in_features):
        raise Mistake(f"SmolLM2 has blocks 0..{model.n_layers - 1} with {model.blocks[0].mlp.down.in_features} "
                      f"units each; LAYER = {layer}, UNIT = {unit}", "find")
    windows = token_windows(tok, "shakespeare", "train", **NEURON_WINDOWS)
    _, positions = top_activations(model, windows, layer, NEURON_CONTEXTS)
    fired = [tok.decode([int(t)]) for t in windows.flatten()[positions[unit]]]
    share = sum(t == trigger for t in fired) / len(fired)
    if share < TRIGGER_SHARE:
        common = max(set(fired), key=fired.count)
        raise Mistake(f"block {layer} unit {unit} fires on {quoted(trigger)} in {share:.0%} of its top "
                      f"{len(fired)} contexts (its commonest trigger is {quoted(common)}, {fired.count(common)} "
                      "of them)", "find")
    _value_compare(m, model, layer, unit, f"SmolLM2 block {layer} unit {unit}")


KV = Exercise(
    name="kv-memory",
    section="The feed-forward block (MLP)",
    title="an MLP unit as a key-value memory: its activations, its value's logits, one found in SmolLM2",
    task=f"""\
Geva et al. (2021): hidden unit i of an MLP reads the stream with a key (column i of W1) and, when it fires,
writes its value (row i of W2) into the stream. Write:

1. unit_activations(model, idx, layer): the hidden activations of block `layer`'s MLP, after the
   nonlinearity (the input of W2), shape (B, T, d_ff), for token ids idx (B, T).
2. value_logits(model, layer, unit): how the unit's value vector moves the logits, read the way the model
   reads the stream: the unembedding of value * (the final norm's gain), the value first centred when the
   final norm is a LayerNorm (its bias, and the division by the stream's size, are the same for every unit:
   leave them out). Shape (vocab,). W2 is model.blocks[layer].mlp.down (an nn.Linear: its weight is (d, d_ff)).
3. LAYER, UNIT, TRIGGER: a unit of SmolLM2 that acts as a memory keyed on one token: in at least
   {TRIGGER_SHARE:.0%} of its top {NEURON_CONTEXTS} contexts over {NEURON_WINDOWS['n']} windows of \
{NEURON_WINDOWS['seq_len']} tokens of Shakespeare it fires on
   the token TRIGGER (`lumen neurons smollm2 --block B --windows {NEURON_WINDOWS['n']}` reads exactly those \
windows).""",
    template='''\
import torch


@torch.no_grad()
def unit_activations(model, idx, layer):
    """(B, T, d_ff): block `layer`'s MLP hidden units after the nonlinearity."""
    raise NotImplementedError


@torch.no_grad()
def value_logits(model, layer, unit):
    """(vocab,): the logit change the unit's value vector writes, read through the final norm's gain."""
    raise NotImplementedError


LAYER, UNIT, TRIGGER = ..., ..., ...   # a block, a unit of its MLP, and the token it fires on (text, e.g. " the")
''',
    specs=(Spec("unit_activations", "function", "def unit_activations(model, idx, layer)", args=(None, None, 0)),
           Spec("value_logits", "function", "def value_logits(model, layer, unit)", args=(None, 0, 0)),
           Spec("LAYER", "value", "LAYER = a block number"), Spec("UNIT", "value", "UNIT = a unit number"),
           Spec("TRIGGER", "value", "TRIGGER = the token it fires on")),
    checks=(
        Check("unit_activations equal lumen's mlp_hidden activation on two small random models", _kv_hidden),
        Check("value_logits point where lumen's value_logits do, on two small random models", _kv_values),
        Check("LAYER, UNIT fire on TRIGGER in SmolLM2; their value logits are lumen's", _kv_found, smollm2=True),
    ),
    hints={
        "task": "lumen.inspect.capture reads any named activation (the hidden units are 'blocks.<layer>.mlp_hidden'); "
                "the value is the unit's column of W2, model.blocks[layer].mlp.down.weight[:, unit], read as the "
                "model reads the stream: through model.ln_f's gain, then model.lm_head.",
        "pre": Hint(
            "where you read the hidden units: before or after the nonlinearity.",
            "MLP(x) = W2 GELU(W1 x): the hidden activation h = GELU(W1 x) is what W2 reads; each unit fires when "
            "its key matches.",
            "The hidden activation is after the nonlinearity: GELU(x W1), the input of W2, not x W1."),
        "gain": Hint(
            "how value_logits turns the value vector into logits: what the model does to the stream just before "
            "the unembedding.",
            "The final step of a language model: take the residual stream, apply the final LayerNorm, multiply by"
            " the unembedding matrix. LN(x) = g * (x - mu) / sqrt(sigma^2 + eps) + b.",
            "The model reads the stream through its final norm: multiply the value by the norm's gain "
                "(model.ln_f.gain) before the unembedding."),
        "centre": Hint(
            "what the final LayerNorm does to a vector before the gain multiplies it.",
            "LN(x) = g * (x - mu) / sqrt(sigma^2 + eps) + b: it subtracts the mean mu of the vector it reads, "
            "then scales.",
            "A LayerNorm removes the mean of what it reads: subtract the value vector's mean first."),
        "key": Hint(
            "which matrix, and which slice of it, you take the unit's vector from: the one that reads the stream "
            "or the one that writes it.",
            "Each column of W1 is a key pattern the input is matched against, and each row of W2 is the value "
            "written into the stream when that key fires (the chapter's x W1, W2 are nn.Linear's weights "
            "transposed).",
            "The value is the unit's column of W2 (mlp.down.weight[:, unit]): what it writes; W1's row is the "
               "key it reads with."),
        "find": Hint(
            "LAYER, UNIT and TRIGGER: whether that unit really fires on that token in SmolLM2 (its top contexts).",
            "A unit is a key-value pair: it responds to a recognisable input pattern (Geva et al. 2021), so its "
            "strongest activations sit on one token, and its value pushes the prediction toward specific next "
            "tokens.",
            "Run `lumen neurons smollm2 --block 22 --windows 16` (or another block): it lists units whose "
                "top contexts fire on one token; pick one and copy its block, unit and token (with its leading "
                "space)."),
    },
    solution=("lumen.inspect.neurons.value_logits", "lumen.inspect.neurons.top_activations"),
)
