"""GELU with one mistake: erf's argument not divided by sqrt(2)"""

import torch


def gelu(x):
    return x * 0.5 * (1 + torch.erf(x))
