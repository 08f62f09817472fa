"""A LayerNorm that makes one mistake: the statistics lose their last axis"""
import torch
import torch.nn as nn


class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(-1)
        var = x.var(-1, unbiased=False)
        return (x - mu) / torch.sqrt(var + self.eps) * self.g + self.b
