import torch
import torch.nn as nn


class Dropout(nn.Module):
    def __init__(self, p=0.1):
        super().__init__()
        self.p = p

    def forward(self, x):
        if self.training and self.p > 0:
            return x * torch.bernoulli(torch.full_like(x, 1 - self.p)) / (1 - self.p)
        return x
