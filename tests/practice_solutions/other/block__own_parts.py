"""The pre-LN block with parts of its own (a LayerNorm through F.layer_norm, an MLP of raw matrices, lumen's
attention) and the two updates written with named intermediates."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from lumen.attention import MultiHeadAttention


class Norm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, 1e-5)


class FeedForward(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.W1, self.W2 = nn.Parameter(torch.randn(d, d_ff) * 0.02), nn.Parameter(torch.randn(d_ff, d) * 0.02)

    def forward(self, x):
        return F.gelu(x @ self.W1) @ self.W2


class TransformerBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__()
        self.ln1, self.ln2 = Norm(d_model), Norm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.mlp = FeedForward(d_model, d_ff or 4 * d_model)
        self.p = dropout

    def forward(self, x, mask=None):
        gathered = F.dropout(self.attn(self.ln1(x), mask), self.p, self.training)
        mid = gathered + x
        thought = self.mlp(self.ln2(mid))
        return thought + mid
