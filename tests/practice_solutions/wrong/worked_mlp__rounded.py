"""The worked example with one mistake: the hidden values rounded to two decimals first, as the chapter's text does"""
import torch
import torch.nn.functional as F

x = torch.tensor([1.0, -1.0])
W1 = torch.tensor([[1.0, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
W2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


def mlp_update(x, W1, W2):
    return x + F.gelu(x @ W1) @ W2


STREAM_AFTER = [1.79, -1.21]
