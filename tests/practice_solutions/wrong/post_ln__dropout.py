"""A PostLNBlock block with one mistake: dropout on attention's write in every mode"""
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
        x = self.ln1(x + nn.functional.dropout(self.attn(x, mask), self.p, training=True))
        x = self.ln2(x + self.mlp(x))
        return x
