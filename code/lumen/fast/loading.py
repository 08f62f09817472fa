"""A GGUF file to a model whose quantized matrices stay as the file's blocks (`load_quantized`): its
Q8_0/Q4_1 linear layers QuantLinear ones, its embedding a QuantEmbedding (quant.py), their quads (quads.py)
in one buffer in the order a decoded token reads them; the model built by GPT.from_state as any other.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..formats import Loaded, build, read
from ..runtime.heap import hand_back_free_memory, huge_page_bytes
from .quads import quads_shape
from .quant import QuantEmbedding, QuantLinear, QuantMatrix

# a block's matrices in the order its forward reads them (others after them, by name)
READING = ("attn.q", "attn.k", "attn.v", "attn.out", "mlp.w_gate", "mlp.w_up", "mlp.fc", "mlp.w_down", "mlp.proj")


def reading_order(name: str, tied: bool) -> tuple:
    """Where a matrix comes in a decoded token's reads: the embedding first (a tied one is the unembedding:
    last), then block by block, each block's matrices as its forward reads them, the unembedding last."""
    layer = name.removesuffix(".weight")
    if layer == "tok_emb":
        return (2,) if tied else (0,)
    if layer.startswith("blocks."):
        _, i, rest = layer.split(".", 2)
        return (1, int(i), READING.index(rest) if rest in READING else len(READING), rest)
    return (2, layer)


def load_quantized(spec: str, device: str | torch.device = "cpu") -> Loaded:
    """A GGUF model (smollm2 or a .gguf file) whose Q8_0/Q4_1 matrices stay as the file's blocks: every such
    linear layer a QuantLinear, the embedding a QuantEmbedding (a tied unembedding reads the same blocks),
    the rest (the norms) as lumen.formats reads them. Activations are float32. The matrices' quads lie in one
    buffer in the order a decoded token reads them (`reading_order`): the memory a product asks for ahead of
    its reads runs on into the next matrix's. The buffer is in 2 MiB pages where Linux gives them
    (`runtime.heap.huge_page_bytes`): a token's products cross a page every 2 MiB, not every 4 KiB (on a
    Sapphire Rapids VM their CPU time fell by ~30%). On a device other than the CPU
    a decoded token's product is torch's formula (`QuantMatrix.rounded_row_product`): quant.cpp is a CPU kernel.

        >>> loaded = load_quantized("smollm2")                         # doctest: +SKIP
        >>> loaded.model.blocks[0].attn.q.matrix                    # doctest: +SKIP
        QuantMatrix(576 x 576, Q4_1)
    """
    w = read(spec, quantized=True)
    parts: dict[str, nn.Module] = {}
    order = sorted(w.quantized, key=lambda name: reading_order(name, w.cfg.tie_embeddings))
    shapes = {name: quads_shape(*w.quantized[name][1:]) for name in order}
    buffer = huge_page_bytes(sum(q * b for q, b in shapes.values()))
    at = 0
    for name in order:  # (each matrix's file layout let go once it is in the buffer: no second copy)
        size = shapes[name][0] * shapes[name][1]
        into = buffer[at: at + size].view(shapes[name])
        layer, matrix = name.removesuffix(".weight"), QuantMatrix(*w.quantized.pop(name), into=into)
        parts[layer] = QuantEmbedding(matrix) if layer == "tok_emb" else QuantLinear(matrix)
        at += size
        hand_back_free_memory()  # (the file layout's buffers, freed: else the heap keeps them, ~60 MiB here)
    embedding = parts.get("tok_emb")
    if w.cfg.tie_embeddings and isinstance(embedding, QuantEmbedding):
        parts["lm_head"] = QuantLinear(embedding.matrix)  # the same blocks, read as the unembedding
    return Loaded(build(w, device, parts=parts), w.tokenizer, spec)
