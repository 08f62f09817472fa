"""Dropout with one mistake: left on at inference"""
import torch
import torch.nn as nn


class Dropout(nn.Module):
    def __init__(self, p=0.1):
        super().__init__()
        self.p = p

    def forward(self, x):
        keep = torch.rand_like(x) >= self.p
        return x * keep / (1 - self.p)
