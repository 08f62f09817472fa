"""RMSNorm as x * rsqrt(mean square + eps), gain first."""
import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.g * x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps)
