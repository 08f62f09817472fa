"""One naming scheme for the places inside a model, used everywhere: hooks and caches, lenses, attribution,
patching, the command line's tables, figures, the explorer page and every JSON file.

A name is a path into the model, blocks counted from 0 as in `model.blocks[i]`:

    embed                   the residual stream the embedding writes (before block 0)
    blocks.3.resid_post     an activation inside block 3 (ACTIVATIONS lists the kinds, DETAILS finer ones)
    blocks.3.attn           a write into the stream: block 3's attention output (also mlp)
    blocks.3.head.2         a write: head 2 of block 3, through its slice of attn.out
    final                   the final-normed stream the unembedding reads

and each has a display name for people: "embed", "block 3 resid_post", "block 3 attention",
"block 3 head 2". The stream after l blocks (a lens's row l) is `stream(l)`: "embed", then "block l-1".

    >>> activation(3, "resid_post"), head(3, 2)
    ('blocks.3.resid_post', 'blocks.3.head.2')
    >>> parse("blocks.3.head.2")
    Name(layer=3, kind='head', head=2)
    >>> display("blocks.3.head.2"), display("blocks.3.mlp"), stream(0), stream(4)
    ('block 3 head 2', 'block 3 MLP', 'embed', 'block 3')
"""

from __future__ import annotations

import re
from typing import NamedTuple

EMBED, FINAL = "embed", "final"
FINAL_SCALE = "final_scale"   # the scale the final norm divides the stream by (B, T, 1)

# the activations inside every block that a cache keeps by default: the stream and what is written into it
ACTIVATIONS = ("resid_pre", "attn_out", "resid_mid", "mlp_hidden", "mlp_out", "resid_post", "attn_pattern",
               "attn_heads")
# finer places, asked for by name: the norms' scales (B, T, 1); each head's query, key and value before
# RoPE (B, T, heads, d_head; keys and values per KV head); the scores before the softmax (B, heads, T, S);
# z, every head's output (B, T, heads, d_head: attn_heads head by head); the MLP's pre-activation (its
# gate's, for a gated MLP) (B, T, d_ff); the queries and keys after their q/k norms, before RoPE (as q and k
# where a family has no q/k norm); a mixture of experts' router scores (B, T, n_experts) and the experts it
# picks for each token (B, T, k) (ROUTER: only in blocks whose MLP is a mixture, which have no single mlp_pre
# and mlp_hidden)
DETAILS = ("ln1_scale", "q", "k", "v", "q_normed", "k_normed", "attn_scores", "z", "ln2_scale", "mlp_pre",
           "router_logits", "expert_choices")
ROUTER = ("router_logits", "expert_choices")
# every kind, in the order the forward pass makes them
KINDS = ("resid_pre", "ln1_scale", "q", "k", "v", "q_normed", "k_normed", "attn_scores", "attn_pattern",
         "attn_heads", "z", "attn_out", "resid_mid", "ln2_scale", "router_logits", "expert_choices", "mlp_pre",
         "mlp_hidden", "mlp_out", "resid_post")
# the writes a block adds to the stream (what a logit is split into), and what they are called for people
WRITES = {"attn": "attention", "mlp": "MLP"}

_NAME = re.compile(r"blocks\.(\d+)\.(\w+?)(?:\.(\d+))?$")


class Name(NamedTuple):
    """A name taken apart: its block (None for embed, final and the other names outside the blocks), its
    kind (an activation kind, attn, mlp, head, or the whole name outside the blocks) and its head, if any."""

    layer: int | None
    kind: str
    head: int | None = None


def activation(layer: int, kind: str) -> str:
    """The name of activation `kind` (one of KINDS) in block `layer`."""
    return f"blocks.{layer}.{kind}"


def write(layer: int, kind: str) -> str:
    """The name of block `layer`'s write `kind` ("attn" or "mlp")."""
    return f"blocks.{layer}.{kind}"


def head(layer: int, h: int) -> str:
    """The name of head h of block `layer`, as a write into the stream."""
    return f"blocks.{layer}.head.{h}"


def parse(name: str) -> Name:
    """A name's parts (see `Name`); a name outside the blocks (embed, final, tok_emb, ln_f.b) is kind itself."""
    m = _NAME.match(name)
    if m is None:
        return Name(None, name)
    layer, kind, h = m.groups()
    if kind == "head" and h is None or kind != "head" and h is not None:
        return Name(None, name)
    return Name(int(layer), kind, int(h) if h is not None else None)


def display(name: str) -> str:
    """The name for people: "block 3 head 2", "block 3 attention", "block 3 resid_post", "embed"."""
    layer, kind, h = parse(name)
    if layer is None:
        return kind
    if h is not None:
        return f"block {layer} head {h}"
    return f"block {layer} {WRITES.get(kind, kind)}"


def stream(layers: int) -> str:
    """The stream after `layers` blocks, named by the block that wrote it last: "embed" for 0 blocks,
    else "block layers-1" (a lens's rows, a patching map's "the stream after")."""
    return EMBED if layers == 0 else f"block {layers - 1}"
