"""The worked example with one mistake: tanh-GELU instead of exact GELU"""
import torch
import torch.nn.functional as F

x = torch.tensor([1.0, -1.0])
W1 = torch.tensor([[1.0, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
W2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


def mlp_update(x, W1, W2):
    return x + F.gelu(x @ W1, approximate='tanh') @ W2


STREAM_AFTER = [1.796, -1.204]
