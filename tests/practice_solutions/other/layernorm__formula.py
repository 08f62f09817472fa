"""LayerNorm written another way: the variance as the mean squared deviation, divided by rsqrt."""
import torch
import torch.nn as nn


class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        centred = x - x.mean(dim=-1, keepdim=True)
        inv_std = torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.b + self.g * (centred * inv_std)
