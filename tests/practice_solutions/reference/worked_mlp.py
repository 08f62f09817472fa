import torch

from lumen.block import MLP

x = torch.tensor([1.0, -1.0])
W1 = torch.tensor([[1.0, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
W2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


def mlp_update(x, W1, W2):
    mlp = MLP(W1.size(0), W1.size(1), activation="gelu", bias=False)
    with torch.no_grad():
        mlp.fc.weight.copy_(W1.T)
        mlp.proj.weight.copy_(W2.T)
    return x + mlp(x)


STREAM_AFTER = [round(v, 3) for v in mlp_update(x, W1, W2).tolist()]
