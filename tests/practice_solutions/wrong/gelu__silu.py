"""GELU with one mistake: a sigmoid instead of the normal CDF"""

import torch


def gelu(x):
    return x * torch.sigmoid(x)
