"""GELU with one mistake: ReLU"""

import torch


def gelu(x):
    return torch.clamp(x, min=0)
