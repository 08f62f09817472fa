"""The sandwich block as one loop over its two branches, each a (read norm, branch, write norm) triple, with
torch's nn.RMSNorm for the norms."""
import torch.nn as nn
import torch.nn.functional as F

from lumen.attention import MultiHeadAttention
from lumen.block import MLP


class SandwichBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__()
        self.ln1, self.ln1_post = nn.RMSNorm(d_model, eps=1e-6), nn.RMSNorm(d_model, eps=1e-6)
        self.ln2, self.ln2_post = nn.RMSNorm(d_model, eps=1e-6), nn.RMSNorm(d_model, eps=1e-6)
        self.attn, self.mlp = MultiHeadAttention(d_model, n_heads), MLP(d_model, d_ff, dropout)
        self.p = dropout

    def forward(self, x, mask=None):
        gather = lambda h: F.dropout(self.attn(h, mask), self.p, self.training)  # noqa: E731
        for read, branch, write in ((self.ln1, gather, self.ln1_post), (self.ln2, self.mlp, self.ln2_post)):
            x = x + write(branch(read(x)))
        return x
