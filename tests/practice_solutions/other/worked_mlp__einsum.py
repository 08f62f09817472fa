import math

import torch

x = torch.tensor([1.0, -1.0])
W1 = torch.tensor([[1.0, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
W2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


def mlp_update(x, W1, W2):
    pre = torch.einsum("...d,dh->...h", x, W1)
    h = pre * 0.5 * (1 + torch.erf(pre / math.sqrt(2)))
    return x + torch.einsum("...h,hd->...d", h, W2)


STREAM_AFTER = (1.7958, -1.2042)
