"""LayerNorm through torch's own kernel, with the chapter's parameter names."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.d, self.eps = d, eps
        self.g = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, (self.d,), self.g, self.b, self.eps)
