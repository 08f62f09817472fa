"""An RMSNorm that makes one mistake: the mean square over the batch"""
import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(0, keepdim=True) + self.eps)
        return x / rms * self.g
