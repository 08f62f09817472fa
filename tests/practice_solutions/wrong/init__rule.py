"""GPT-2's initialisation with one mistake: the 1/sqrt(2N) rule left out."""
import torch.nn as nn


def init_gpt2(model):
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
