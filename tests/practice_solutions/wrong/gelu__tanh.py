"""GELU with one mistake: the tanh approximation"""
import math

import torch


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
