"""Dropout with one mistake: the same mask at every call"""
import torch
import torch.nn as nn


class Dropout(nn.Module):
    def __init__(self, p=0.1):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        g = torch.Generator().manual_seed(0)
        keep = torch.rand(x.shape, generator=g) >= self.p
        return x * keep / (1 - self.p)
