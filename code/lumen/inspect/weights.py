"""One block's attention weights head by head: views of q, k, v and out, the shapes circuit analysis uses.

    >>> model = GPT.from_preset("baby-llama", n_layers=2)        # 6 query heads, 2 KV heads of 64
    >>> w = head_weights(model, 1)
    >>> w.W_Q.shape, w.W_K.shape, w.W_O.shape
    (torch.Size([6, 384, 64]), torch.Size([6, 384, 64]), torch.Size([6, 64, 384]))
    >>> w.OV(0).shape                                            # what head 0 writes for what it reads
    torch.Size([384, 384])

With grouped-query attention a KV head serves a group of query heads; W_K and W_V repeat it for each of
them, so that index h is query head h everywhere (`kv_head(h)` names the one it reads). The maps are x @ W:
row vectors in, as the stream is laid out; q, k (before RoPE) and v of head h are ln1(x) @ W[h] + b[h].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import GPT
from .hooks import check_layer


@dataclass
class HeadWeights:
    """W_Q, W_K, W_V (H, d, d_head), their biases (H, d_head) or None, W_O (H, d_head, d) and b_O (d,) or None."""

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor | None
    b_K: torch.Tensor | None
    b_V: torch.Tensor | None
    b_O: torch.Tensor | None
    group: int            # query heads per KV head

    def kv_head(self, h: int) -> int:
        """The KV head query head h reads."""
        return h // self.group

    def OV(self, h: int) -> torch.Tensor:
        """(d, d): W_V[h] @ W_O[h], what head h writes into the stream for what it reads (pattern aside)."""
        return self.W_V[h] @ self.W_O[h]

    def QK(self, h: int) -> torch.Tensor:
        """(d, d): W_Q[h] @ W_K[h]^T, the bilinear form of head h's scores (before RoPE and the 1/sqrt(d_head))."""
        return self.W_Q[h] @ self.W_K[h].T


@torch.no_grad()
def head_weights(model: GPT, layer: int) -> HeadWeights:
    """Block `layer`'s attention weights per head (views and repeats of the model's own tensors, detached)."""
    attn = model.attention(check_layer(model, layer))
    H, H_kv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    group = H // H_kv

    def per_head(lin: torch.nn.Linear, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        W = lin.weight.detach().T.unflatten(1, (n, hd)).transpose(0, 1)            # (n, d, hd)
        b = lin.bias.detach().view(n, hd) if lin.bias is not None else None
        if n != H:                                                                 # a KV head for each query head
            W = W.repeat_interleave(group, 0)
            b = b.repeat_interleave(group, 0) if b is not None else None
        return W, b

    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = per_head(attn.q, H), per_head(attn.k, H_kv), per_head(attn.v, H_kv)
    W_O = attn.out.weight.detach().T.view(H, hd, -1)                                 # (H, hd, d)
    b_O = attn.out.bias.detach() if attn.out.bias is not None else None
    return HeadWeights(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O, group)
