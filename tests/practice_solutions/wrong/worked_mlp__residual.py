"""The worked example with one mistake: the MLP's write returned as the stream"""
import torch
import torch.nn.functional as F

x = torch.tensor([1.0, -1.0])
W1 = torch.tensor([[1.0, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
W2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


def mlp_update(x, W1, W2):
    return F.gelu(x @ W1) @ W2


STREAM_AFTER = [0.796, -0.204]
