"""The worked example with one mistake: W1 multiplied as if it were stored (hidden, d)"""
import torch
import torch.nn.functional as F

x = torch.tensor([1.0, -1.0])
W1 = torch.tensor([[1.0, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
W2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


def mlp_update(x, W1, W2):
    return x + F.gelu(x @ W1.T) @ W2.T


STREAM_AFTER = [1.796, -1.204]
