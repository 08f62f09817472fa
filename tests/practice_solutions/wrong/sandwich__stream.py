"""A SandwichBlock with one mistake: the post norms on the stream (after the add) instead of on the branch's write"""
import torch.nn as nn

from lumen.attention import MultiHeadAttention
from lumen.block import MLP, RMSNorm


class SandwichBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__()
        self.ln1, self.ln1_post = RMSNorm(d_model), RMSNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ln2, self.ln2_post = RMSNorm(d_model), RMSNorm(d_model)
        self.mlp = MLP(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x, mask=None):
        x = self.ln1_post(x + self.drop(self.attn(self.ln1(x), mask)))
        x = self.ln2_post(x + self.mlp(self.ln2(x)))
        return x
