"""Dropout with one mistake: p taken as the probability of keeping"""
import torch
import torch.nn as nn


class Dropout(nn.Module):
    def __init__(self, p=0.1):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        keep = torch.rand_like(x) < self.p
        return x * keep / self.p if self.p > 0 else x
