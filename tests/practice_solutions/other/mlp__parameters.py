"""The MLP with its own layout: W1 and W2 stored as (in, out) matrices, as the chapter writes them."""
import math

import torch
import torch.nn as nn


class Affine(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W = nn.Parameter(torch.randn(d_in, d_out) / math.sqrt(d_in))
        self.b = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        return torch.einsum("...i,io->...o", x, self.W) + self.b


class MLP(nn.Module):
    def __init__(self, d_model, d_ff=None, dropout=0.0):
        super().__init__()
        hidden = d_ff if d_ff is not None else 4 * d_model
        self.fc, self.proj = Affine(d_model, hidden), Affine(hidden, d_model)
        self.p = dropout

    def forward(self, x):
        u = self.fc(x)
        h = u * 0.5 * (1.0 + torch.erf(u / math.sqrt(2.0)))   # exact GELU, by hand
        out = self.proj(h)
        if self.training and self.p > 0:
            out = out * (torch.rand_like(out) >= self.p) / (1 - self.p)
        return out
