"""A PostLNBlock with one mistake: the MLP's residual left out, LN2(MLP(x))"""
import torch.nn as nn

from lumen.attention import MultiHeadAttention
from lumen.block import MLP, LayerNorm


class PostLNBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__()
        self.ln1 = LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ln2 = LayerNorm(d_model)
        self.mlp = MLP(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x, mask=None):
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        x = self.ln2(self.mlp(x))
        return x
