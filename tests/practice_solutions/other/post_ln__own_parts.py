"""The post-LN block with torch's nn.LayerNorm for its norms."""
import torch.nn as nn

from lumen.attention import MultiHeadAttention
from lumen.block import MLP


class PostLNBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.0):
        super().__init__()
        self.attn, self.mlp = MultiHeadAttention(d_model, n_heads), MLP(d_model, d_ff, dropout)
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        for f, norm in ((lambda h: self.drop(self.attn(h, mask)), self.ln1), (self.mlp, self.ln2)):
            x = norm(x + f(x))
        return x
